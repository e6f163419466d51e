#!/usr/bin/env zsh
# zsh_complete.zsh SCRIPT|DIR 'words typed': the matches an interactive zsh offers when
# Tab is pressed after the words, one per line. SCRIPT is sourced after compinit; a DIR
# holding _ddprun goes on $fpath before compinit (the autoload route). Runs a real
# interactive zsh on a pseudo-terminal (zsh/zpty); compadd is wrapped to print what
# each completer adds. Markers are spelled in two pieces so the terminal's echo of
# these lines never matches them. Exit 4 when no answer comes within 20 s.
zmodload zsh/zpty zsh/zselect || exit 3
zpty z "TERM=xterm zsh -f -i"  # zle needs a terminal type it knows
if [[ -d $1 ]]; then
  zpty -w z "PROMPT=; RPROMPT=; fpath=(${(q)1} \$fpath); autoload -Uz compinit; compinit -u -D"
else
  zpty -w z "PROMPT=; RPROMPT=; autoload -Uz compinit; compinit -u -D; source ${(q)1}"
fi
zpty -w z "bindkey '^I' complete-word"
zpty -w z "zstyle ':completion:*' list-grouped false"
zpty -w z "zstyle ':completion:*' insert-tab false"
zpty -w z 'compadd() { local -a __m; builtin compadd -O __m "$@"; (( $#__m )) && print -rl -- "<""m>"${^__m}; builtin compadd "$@" }'
zpty -w z 'finish() { print -r -- "<""done>"; exit }'
zpty -w z 'comppostfuncs=(finish)'
zpty -w -n z "$2"$'\t'
local line deadline=$(( SECONDS + 20 ))
while :; do
  if ! zpty -r -t z line; then
    if (( SECONDS > deadline )); then print -u2 "zsh_complete: no answer within 20 s"; zpty -d z; exit 4; fi
    zselect -t 5  # 50 ms
    continue
  fi
  [[ $line == *'<done>'* ]] && break
  line=${line%$'\n'}  # zpty -r keeps the line's end: CR LF from the terminal
  [[ $line == *'<m>'* ]] && print -r -- "${${line##*<m>}%$'\r'}"
done
zpty -d z

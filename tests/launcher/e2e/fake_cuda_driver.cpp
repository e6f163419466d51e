// A libcuda.so.1 that is there but fails, as a broken driver install does: cuInit
// answers CUDA_ERROR_UNKNOWN (999). Loaded by ddprun through LD_LIBRARY_PATH.
extern "C" {
int cuInit(unsigned int) { return 999; }
int cuDeviceGetCount(int* count) {
  *count = 0;
  return 999;
}
}

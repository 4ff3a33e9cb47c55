/* Compile-time checks of include/nccl.h against NCCL 2.30's ABI: values,
 * sizes and offsets a program compiled against NVIDIA's header relies on.
 * Built with and without a cuda_runtime.h on the include path. */
#include <nccl.h>
#include <stddef.h>

#define CAT2(a, b) a##b
#define CAT(a, b) CAT2(a, b)
#define STATIC(cond) typedef char CAT(abi_check_, __LINE__)[(cond) ? 1 : -1]

#ifdef EXPECT_CUDA_RUNTIME
#  if !defined(OXCCL_HAVE_CUDA_RUNTIME) || !defined(FAKE_CUDA_RUNTIME)
#    error "cuda_runtime.h was on the path but not used"
#  endif
#else
#  ifdef OXCCL_HAVE_CUDA_RUNTIME
#    error "no cuda_runtime.h expected"
#  endif
#endif

STATIC(sizeof(cudaStream_t) == sizeof(void *));
STATIC(sizeof(ncclUniqueId) == 128);
STATIC(NCCL_VERSION_CODE == 23007);
STATIC(NCCL_VERSION(2, 30, 7) == 23007);
STATIC(NCCL_VERSION(2, 28, 9) == 22809);
STATIC(NCCL_VERSION(2, 8, 4) == 2804);
STATIC(ncclSuccess == 0 && ncclUnhandledCudaError == 1 && ncclSystemError == 2);
STATIC(ncclInternalError == 3 && ncclInvalidArgument == 4 && ncclInvalidUsage == 5);
STATIC(ncclRemoteError == 6 && ncclInProgress == 7 && ncclTimeout == 8 && ncclNumResults == 9);
STATIC(ncclInt8 == 0 && ncclUint8 == 1 && ncclInt32 == 2 && ncclUint32 == 3);
STATIC(ncclInt64 == 4 && ncclUint64 == 5 && ncclFloat16 == 6 && ncclFloat32 == 7);
STATIC(ncclFloat64 == 8 && ncclBfloat16 == 9 && ncclFloat8e4m3 == 10 && ncclFloat8e5m2 == 11);
STATIC(ncclNumTypes == 12);
STATIC(ncclSum == 0 && ncclProd == 1 && ncclMax == 2 && ncclMin == 3 && ncclAvg == 4);
STATIC(ncclNumOps == 5);
STATIC(sizeof(ncclRedOp_t) == sizeof(int) && sizeof(ncclResult_t) == sizeof(int));
STATIC(ncclScalarDevice == 0 && ncclScalarHostImmediate == 1);
STATIC(NCCL_SPLIT_NOCOLOR == -1);
STATIC(sizeof(ncclConfig_t) == 96);
STATIC(offsetof(ncclConfig_t, magic) == 8 && offsetof(ncclConfig_t, version) == 12);
STATIC(offsetof(ncclConfig_t, blocking) == 16 && offsetof(ncclConfig_t, maxCTAs) == 28);
STATIC(offsetof(ncclConfig_t, netName) == 32 && offsetof(ncclConfig_t, commName) == 48);
STATIC(offsetof(ncclConfig_t, nvlsCTAs) == 68 && offsetof(ncclConfig_t, nvlinkCentricSched) == 76);
STATIC(offsetof(ncclConfig_t, graphUsageMode) == 80 && offsetof(ncclConfig_t, graphStreamOrdering) == 92);
STATIC(ncclStatGpuMemSuspend == 0 && ncclStatGpuMemSuspended == 1 && ncclStatGpuMemPersist == 2 && ncclStatGpuMemTotal == 3);
STATIC(sizeof(ncclWaitSignalDesc_t) == 16 && offsetof(ncclWaitSignalDesc_t, ctx) == 12);
STATIC(NCCL_REVOKE_DEFAULT == 0 && NCCL_SUSPEND_MEM == 1 && NCCL_WIN_STRICT_ORDERING == 2);
STATIC(sizeof(ncclSimInfo_t) == 24);

int abi_check_config_initializer(void) {
  ncclConfig_t c = NCCL_CONFIG_INITIALIZER;
  ncclSimInfo_t s = NCCL_SIM_INFO_INITIALIZER;
  return (int)(c.size == sizeof c && c.magic == 0xcafebeef && c.version == 23007 &&
               c.blocking == NCCL_CONFIG_UNDEF_INT && c.netName == NULL &&
               c.nvlinkCentricSched == NCCL_CONFIG_UNDEF_INT &&
               c.graphStreamOrdering == NCCL_CONFIG_UNDEF_INT && s.size == sizeof s);
}

/* Every function is declared with the types a caller uses. */
int abi_check_calls(ncclComm_t comm, cudaStream_t stream) {
  ncclUniqueId id;
  int v;
  ncclRedOp_t op;
  ncclComm_t child;
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  float f = 1;
  ncclGetVersion(&v);
  ncclGetUniqueId(&id);
  ncclCommInitRankConfig(&child, 1, id, 0, &cfg);
  ncclCommSplit(comm, NCCL_SPLIT_NOCOLOR, 0, &child, &cfg);
  ncclRedOpCreatePreMulSum(&op, &f, ncclFloat32, ncclScalarHostImmediate, comm);
  uint64_t m;
  ncclParamHandle_t ph;
  int32_t i32;
  const char *str;
  ncclCommMemStats(comm, ncclStatGpuMemTotal, &m);
  ncclCommRevoke(comm, NCCL_REVOKE_DEFAULT);
  ncclCommGrow(comm, 2, &id, -1, &child, &cfg);
  ncclCommGetUniqueId(comm, &id);
  ncclParamBind(&ph, "NCCL_ALGO");
  ncclParamGetI32(ph, &i32);
  ncclParamGetStr(ph, &str);
  pncclCommCount(comm, &v);
  return (int)ncclAllReduce(&f, &f, 1, ncclFloat32, op, comm, stream);
}

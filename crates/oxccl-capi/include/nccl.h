/*
 * nccl.h for oxccl's libnccl.so.2.
 *
 * Written for oxccl (Apache-2.0). It declares the C interface of NCCL 2.30
 * with the same values and layouts, so that programs compiled against it
 * and programs compiled against NVIDIA's header both run on oxccl's
 * library. Every function has NCCL's profiling twin (`pncclX` for
 * `ncclX`). What oxccl does not support yet (device communicators,
 * one-sided calls) is declared and returns
 * ncclInvalidUsage with a message for ncclGetLastError; see
 * crates/oxccl-capi/README.md.
 *
 * Builds with or without the CUDA toolkit: when <cuda_runtime.h> is not
 * found (or OXCCL_NO_CUDA_RUNTIME is defined) cudaStream_t is an opaque
 * pointer of the same size, which is what the library receives anyway.
 */
#ifndef OXCCL_NCCL_H
#define OXCCL_NCCL_H

#include <stddef.h>
#include <stdint.h>
#include <limits.h>

#if !defined(OXCCL_NO_CUDA_RUNTIME) && defined(__has_include)
#  if __has_include(<cuda_runtime.h>)
#    include <cuda_runtime.h>
#    define OXCCL_HAVE_CUDA_RUNTIME 1
#  endif
#endif
#ifndef OXCCL_HAVE_CUDA_RUNTIME
/* The CUDA runtime's stream is a pointer to this incomplete struct. */
typedef struct CUstream_st *cudaStream_t;
#endif

/* Version: the NCCL release whose interface this library implements. */
#define NCCL_MAJOR 2
#define NCCL_MINOR 30
#define NCCL_PATCH 7
#define NCCL_SUFFIX ""
#define NCCL_VERSION(X, Y, Z) (((X) <= 2 && (Y) <= 8) ? (X) * 1000 + (Y) * 100 + (Z) : (X) * 10000 + (Y) * 100 + (Z))
#define NCCL_VERSION_CODE NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH)

#ifdef __cplusplus
extern "C" {
#endif

/* A communicator: one rank's handle. Opaque. */
typedef struct ncclComm *ncclComm_t;
#define NCCL_COMM_NULL NULL

/* The rendezvous token made by ncclGetUniqueId, passed by value. */
#define NCCL_UNIQUE_ID_BYTES 128
typedef struct {
  char internal[NCCL_UNIQUE_ID_BYTES];
} ncclUniqueId;

/* Results. */
typedef enum {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7,
  ncclTimeout = 8,
  ncclNumResults = 9
} ncclResult_t;

/* Element types. */
typedef enum {
  ncclInt8 = 0,
  ncclChar = 0,
  ncclUint8 = 1,
  ncclInt32 = 2,
  ncclInt = 2,
  ncclUint32 = 3,
  ncclInt64 = 4,
  ncclUint64 = 5,
  ncclFloat16 = 6,
  ncclHalf = 6,
  ncclFloat32 = 7,
  ncclFloat = 7,
  ncclFloat64 = 8,
  ncclDouble = 8,
  ncclBfloat16 = 9,
  ncclFloat8e4m3 = 10,
  ncclFloat8e5m2 = 11,
  ncclNumTypes = 12
} ncclDataType_t;

/* Reduction operators. Values from ncclNumOps up are made by
 * ncclRedOpCreatePreMulSum and belong to one communicator. */
typedef enum {
  ncclSum = 0,
  ncclProd = 1,
  ncclMax = 2,
  ncclMin = 3,
  ncclAvg = 4,
  ncclNumOps = 5,
  ncclMaxRedOp = 0x7fffffff
} ncclRedOp_t;

/* Where a PreMulSum scalar lives. */
typedef enum {
  ncclScalarDevice = 0,
  ncclScalarHostImmediate = 1
} ncclScalarResidence_t;

/* Communicator configuration. Set it with NCCL_CONFIG_INITIALIZER, then
 * change the fields you need; the library reads only the fields that
 * `size` and `version` say the caller's layout has. */
#define NCCL_CONFIG_UNDEF_INT INT_MIN
#define NCCL_CONFIG_UNDEF_PTR NULL
#define NCCL_SPLIT_NOCOLOR -1
#define NCCL_UNDEF_FLOAT -1.0f

#define NCCL_CTA_POLICY_DEFAULT 0x00
#define NCCL_CTA_POLICY_EFFICIENCY 0x01
#define NCCL_CTA_POLICY_ZERO 0x02

#define NCCL_SHRINK_DEFAULT 0x00
#define NCCL_SHRINK_ABORT 0x01

#define NCCL_WIN_DEFAULT 0x00
#define NCCL_WIN_COLL_SYMMETRIC 0x01
#define NCCL_WIN_STRICT_ORDERING 0x02
#define NCCL_WIN_REQUIRED_ALIGNMENT 4096

#define NCCL_REVOKE_DEFAULT 0x00
#define NCCL_SUSPEND_MEM 0x01

typedef struct ncclConfig_v23000 {
  size_t size;
  unsigned int magic;
  unsigned int version;
  int blocking;
  int cgaClusterSize;
  int minCTAs;
  int maxCTAs;
  const char *netName;
  int splitShare;
  int trafficClass;
  const char *commName;
  int collnetEnable;
  int CTAPolicy;
  int shrinkShare;
  int nvlsCTAs;
  int nChannelsPerNetPeer;
  int nvlinkCentricSched;
  int graphUsageMode;
  int numRmaCtx;
  int maxP2pPeers;
  int graphStreamOrdering;
} ncclConfig_t;

#define NCCL_CONFIG_INITIALIZER {                                         \
  sizeof(ncclConfig_t),               /* size */                          \
  0xcafebeef,                         /* magic */                         \
  NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH), /* version */         \
  NCCL_CONFIG_UNDEF_INT,              /* blocking */                      \
  NCCL_CONFIG_UNDEF_INT,              /* cgaClusterSize */                \
  NCCL_CONFIG_UNDEF_INT,              /* minCTAs */                       \
  NCCL_CONFIG_UNDEF_INT,              /* maxCTAs */                       \
  NCCL_CONFIG_UNDEF_PTR,              /* netName */                       \
  NCCL_CONFIG_UNDEF_INT,              /* splitShare */                    \
  NCCL_CONFIG_UNDEF_INT,              /* trafficClass */                  \
  NCCL_CONFIG_UNDEF_PTR,              /* commName */                      \
  NCCL_CONFIG_UNDEF_INT,              /* collnetEnable */                 \
  NCCL_CONFIG_UNDEF_INT,              /* CTAPolicy */                     \
  NCCL_CONFIG_UNDEF_INT,              /* shrinkShare */                   \
  NCCL_CONFIG_UNDEF_INT,              /* nvlsCTAs */                      \
  NCCL_CONFIG_UNDEF_INT,              /* nChannelsPerNetPeer */           \
  NCCL_CONFIG_UNDEF_INT,              /* nvlinkCentricSched */            \
  NCCL_CONFIG_UNDEF_INT,              /* graphUsageMode */                \
  NCCL_CONFIG_UNDEF_INT,              /* numRmaCtx */                     \
  NCCL_CONFIG_UNDEF_INT,              /* maxP2pPeers */                   \
  NCCL_CONFIG_UNDEF_INT,              /* graphStreamOrdering */           \
}

/* What ncclGroupSimulateEnd reports. */
typedef struct {
  size_t size;
  unsigned int magic;
  unsigned int version;
  float estimatedTime; /* microseconds */
} ncclSimInfo_t;

#define NCCL_SIM_INFO_INITIALIZER {                                       \
  sizeof(ncclSimInfo_t), 0x74685283,                                      \
  NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH), NCCL_UNDEF_FLOAT      \
}

/* Registered windows and device communicators: declared, not supported
 * yet (the calls return ncclInvalidUsage). */
typedef struct ncclWindow_vidmem *ncclWindow_t;
typedef struct ncclDevCommRequirements ncclDevCommRequirements;
typedef struct ncclDevComm ncclDevComm;

/* Every function is declared with NCCL's profiling twin: OXCCL_TWIN(ret,
 * ncclX, (args)) declares ncclX and pncclX, the same function under a
 * second name (a profiler may interpose the nccl names and call these). */
#define OXCCL_TWIN(ret, name, args) ret name args; ret p##name args

/* Memory for zero-copy plans (device memory; host memory when the
 * library runs on its host backend, OXCCL_BACKEND=host). */
OXCCL_TWIN(ncclResult_t, ncclMemAlloc, (void **ptr, size_t size));
OXCCL_TWIN(ncclResult_t, ncclMemFree, (void *ptr));

/* Version and identity. */
OXCCL_TWIN(ncclResult_t, ncclGetVersion, (int *version));
OXCCL_TWIN(ncclResult_t, ncclGetUniqueId, (ncclUniqueId *uniqueId));

/* Communicator life cycle. */
OXCCL_TWIN(ncclResult_t, ncclCommInitRankConfig, (ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank, ncclConfig_t *config));
OXCCL_TWIN(ncclResult_t, ncclCommInitRank, (ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank));
OXCCL_TWIN(ncclResult_t, ncclCommInitAll, (ncclComm_t *comms, int ndev, const int *devlist));
OXCCL_TWIN(ncclResult_t, ncclCommInitRankScalable, (ncclComm_t *newcomm, int nranks, int myrank, int nId, ncclUniqueId *commIds, ncclConfig_t *config));
OXCCL_TWIN(ncclResult_t, ncclCommFinalize, (ncclComm_t comm));
OXCCL_TWIN(ncclResult_t, ncclCommDestroy, (ncclComm_t comm));
OXCCL_TWIN(ncclResult_t, ncclCommAbort, (ncclComm_t comm));
OXCCL_TWIN(ncclResult_t, ncclCommSplit, (ncclComm_t comm, int color, int key, ncclComm_t *newcomm, ncclConfig_t *config));
OXCCL_TWIN(ncclResult_t, ncclCommShrink, (ncclComm_t comm, int *excludeRanksList, int excludeRanksCount, ncclComm_t *newcomm, ncclConfig_t *config, int shrinkFlags));
OXCCL_TWIN(ncclResult_t, ncclCommSuspend, (ncclComm_t comm, int flags));
OXCCL_TWIN(ncclResult_t, ncclCommResume, (ncclComm_t comm));

/* Errors. */
OXCCL_TWIN(const char *, ncclGetErrorString, (ncclResult_t result));
OXCCL_TWIN(const char *, ncclGetLastError, (ncclComm_t comm));
OXCCL_TWIN(void, ncclResetDebugInit, (void));
OXCCL_TWIN(ncclResult_t, ncclCommGetAsyncError, (ncclComm_t comm, ncclResult_t *asyncError));

/* Queries. */
OXCCL_TWIN(ncclResult_t, ncclCommCount, (const ncclComm_t comm, int *count));
OXCCL_TWIN(ncclResult_t, ncclCommCuDevice, (const ncclComm_t comm, int *device));
OXCCL_TWIN(ncclResult_t, ncclCommUserRank, (const ncclComm_t comm, int *rank));

/* Registration. */
OXCCL_TWIN(ncclResult_t, ncclCommRegister, (const ncclComm_t comm, void *buff, size_t size, void **handle));
OXCCL_TWIN(ncclResult_t, ncclCommDeregister, (const ncclComm_t comm, void *handle));
OXCCL_TWIN(ncclResult_t, ncclCommWindowRegister, (ncclComm_t comm, void *buff, size_t size, ncclWindow_t *win, int winFlags));
OXCCL_TWIN(ncclResult_t, ncclCommWindowDeregister, (ncclComm_t comm, ncclWindow_t win));
OXCCL_TWIN(ncclResult_t, ncclDevCommCreate, (ncclComm_t comm, const ncclDevCommRequirements *reqs, ncclDevComm *outDevComm));
OXCCL_TWIN(ncclResult_t, ncclDevCommDestroy, (ncclComm_t comm, const ncclDevComm *devComm));

/* PreMulSum: an op multiplying each rank's input by a scalar, then summing. */
OXCCL_TWIN(ncclResult_t, ncclRedOpCreatePreMulSum, (ncclRedOp_t *op, void *scalar, ncclDataType_t datatype, ncclScalarResidence_t residence, ncclComm_t comm));
OXCCL_TWIN(ncclResult_t, ncclRedOpDestroy, (ncclRedOp_t op, ncclComm_t comm));

/* Collectives: each is enqueued on `stream` and returns at once. Counts are
 * elements per rank as NCCL defines them. */
OXCCL_TWIN(ncclResult_t, ncclReduce, (const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream));
OXCCL_TWIN(ncclResult_t, ncclBcast, (void *buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream));
OXCCL_TWIN(ncclResult_t, ncclBroadcast, (const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream));
OXCCL_TWIN(ncclResult_t, ncclAllReduce, (const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream));
OXCCL_TWIN(ncclResult_t, ncclReduceScatter, (const void *sendbuff, void *recvbuff, size_t recvcount, ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream));
OXCCL_TWIN(ncclResult_t, ncclAllGather, (const void *sendbuff, void *recvbuff, size_t sendcount, ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream));
OXCCL_TWIN(ncclResult_t, ncclAlltoAll, (const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream));
OXCCL_TWIN(ncclResult_t, ncclGather, (const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream));
OXCCL_TWIN(ncclResult_t, ncclScatter, (const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream));

/* Point to point (pair them inside ncclGroupStart/ncclGroupEnd). */
OXCCL_TWIN(ncclResult_t, ncclSend, (const void *sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm, cudaStream_t stream));
OXCCL_TWIN(ncclResult_t, ncclRecv, (void *recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm, cudaStream_t stream));

/* Groups (nest freely; operations run at the outermost ncclGroupEnd). */
OXCCL_TWIN(ncclResult_t, ncclGroupStart, (void));
OXCCL_TWIN(ncclResult_t, ncclGroupEnd, (void));
OXCCL_TWIN(ncclResult_t, ncclGroupSimulateEnd, (ncclSimInfo_t *simInfo));


/* Revoke, grow, memory statistics (2.28.7 to 2.30). */
OXCCL_TWIN(ncclResult_t, ncclCommRevoke, (ncclComm_t comm, int revokeFlags));
OXCCL_TWIN(ncclResult_t, ncclCommGetUniqueId, (ncclComm_t comm, ncclUniqueId *uniqueId));
OXCCL_TWIN(ncclResult_t, ncclCommGrow, (ncclComm_t comm, int nRanks, const ncclUniqueId *uniqueId, int rank, ncclComm_t *newcomm, ncclConfig_t *config));
typedef enum {
  ncclStatGpuMemSuspend = 0,
  ncclStatGpuMemSuspended = 1,
  ncclStatGpuMemPersist = 2,
  ncclStatGpuMemTotal = 3
} ncclCommMemStat_t;
OXCCL_TWIN(ncclResult_t, ncclCommMemStats, (ncclComm_t comm, ncclCommMemStat_t stat, uint64_t *value));
OXCCL_TWIN(ncclResult_t, ncclWinGetUserPtr, (ncclComm_t comm, ncclWindow_t win, void **outUserPtr));

/* One-sided calls on registered windows: declared, not supported yet. */
OXCCL_TWIN(ncclResult_t, ncclPutSignal, (const void *localbuff, size_t count, ncclDataType_t datatype, int peer, ncclWindow_t peerWin, size_t peerWinOffset, int sigIdx, int ctx, unsigned int flags, ncclComm_t comm, cudaStream_t stream));
OXCCL_TWIN(ncclResult_t, ncclSignal, (int peer, int sigIdx, int ctx, unsigned int flags, ncclComm_t comm, cudaStream_t stream));
typedef struct {
  int opCnt;
  int peer;
  int sigIdx;
  int ctx;
} ncclWaitSignalDesc_t;
OXCCL_TWIN(ncclResult_t, ncclWaitSignal, (int nDesc, ncclWaitSignalDesc_t *signalDescs, ncclComm_t comm, cudaStream_t stream));

/* Parameters: the library's settings by NCCL's key (the variable's name
 * without its NCCL_ prefix, or an OXCCL_ name in full). */
typedef struct ncclParamHandle *ncclParamHandle_t;
OXCCL_TWIN(ncclResult_t, ncclParamBind, (ncclParamHandle_t *out, const char *key));
OXCCL_TWIN(ncclResult_t, ncclParamGetI8, (ncclParamHandle_t h, int8_t *out));
OXCCL_TWIN(ncclResult_t, ncclParamGetI16, (ncclParamHandle_t h, int16_t *out));
OXCCL_TWIN(ncclResult_t, ncclParamGetI32, (ncclParamHandle_t h, int32_t *out));
OXCCL_TWIN(ncclResult_t, ncclParamGetI64, (ncclParamHandle_t h, int64_t *out));
OXCCL_TWIN(ncclResult_t, ncclParamGetU8, (ncclParamHandle_t h, uint8_t *out));
OXCCL_TWIN(ncclResult_t, ncclParamGetU16, (ncclParamHandle_t h, uint16_t *out));
OXCCL_TWIN(ncclResult_t, ncclParamGetU32, (ncclParamHandle_t h, uint32_t *out));
OXCCL_TWIN(ncclResult_t, ncclParamGetU64, (ncclParamHandle_t h, uint64_t *out));
OXCCL_TWIN(ncclResult_t, ncclParamGetStr, (ncclParamHandle_t h, const char **out));
OXCCL_TWIN(ncclResult_t, ncclParamGet, (ncclParamHandle_t h, void *out, int maxLen, int *len));
OXCCL_TWIN(ncclResult_t, ncclParamGetParameter, (const char *key, const char **value, int *valueLen));
OXCCL_TWIN(ncclResult_t, ncclParamGetAllParameterKeys, (const char ***table, int *tableLen));
OXCCL_TWIN(void, ncclParamDumpAll, (void));
#undef OXCCL_TWIN

#ifdef __cplusplus
}
#endif

#endif /* OXCCL_NCCL_H */

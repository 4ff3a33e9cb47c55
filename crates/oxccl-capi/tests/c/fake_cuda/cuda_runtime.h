/* Stands in for the CUDA toolkit's header in the header test: it defines
 * cudaStream_t the way the toolkit does (a pointer to struct CUstream_st). */
#ifndef FAKE_CUDA_RUNTIME_H
#define FAKE_CUDA_RUNTIME_H
typedef struct CUstream_st *cudaStream_t;
#define FAKE_CUDA_RUNTIME 1
#endif

/* A minimal NVTX tool for the tests: attached through
 * NVTX_INJECTION64_PATH, it takes the domain module's create, push and pop
 * slots and writes one line per event to the file NVTX_TOOL_OUT names:
 *   create <domain>
 *   push <thread> <payload> <message>
 *   pop <thread>
 * The types below are written from NVTX's documented ABI, not copied. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/syscall.h>

typedef void (*fn_t)(void);
typedef const void *(*get_table_t)(uint32_t id);
typedef struct {
  size_t size;
  int (*module_table)(int module, fn_t ***table, unsigned *count);
} callbacks_t;

typedef struct {
  uint16_t version, size;
  uint32_t category;
  int32_t color_type;
  uint32_t color;
  int32_t payload_type, reserved;
  uint64_t payload;
  int32_t message_type;
  const char *message;
} attrs_t;

static FILE *out;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int domain_token;

static long tid(void) { return (long)syscall(SYS_gettid); }

static void *create(const char *name) {
  pthread_mutex_lock(&lock);
  fprintf(out, "create %s\n", name);
  fflush(out);
  pthread_mutex_unlock(&lock);
  return &domain_token;
}

static int push(void *domain, const attrs_t *a) {
  pthread_mutex_lock(&lock);
  if (domain != &domain_token || a->version != 3 || a->size != sizeof(attrs_t) ||
      a->message_type != 1 || a->payload_type != 1)
    fprintf(out, "bad %ld\n", tid());
  else
    fprintf(out, "push %ld %llu %s\n", tid(), (unsigned long long)a->payload, a->message);
  fflush(out);
  pthread_mutex_unlock(&lock);
  return 0;
}

static int pop(void *domain) {
  pthread_mutex_lock(&lock);
  fprintf(out, domain == &domain_token ? "pop %ld\n" : "bad %ld\n", tid());
  fflush(out);
  pthread_mutex_unlock(&lock);
  return 0;
}

int InitializeInjectionNvtx2(get_table_t get) {
  const char *path = getenv("NVTX_TOOL_OUT");
  if (!path || !(out = fopen(path, "w"))) return 0;
  const callbacks_t *cb = get(1);
  fn_t **table = NULL;
  unsigned n = 0;
  /* 5: the domain module; 12 DomainCreateA, 4 DomainRangePushEx, 5 Pop. */
  if (!cb || !cb->module_table(5, &table, &n) || n < 16) return 0;
  if (table[n] != NULL) return 0;
  *table[12] = (fn_t)create;
  *table[4] = (fn_t)push;
  *table[5] = (fn_t)pop;
  return 1;
}

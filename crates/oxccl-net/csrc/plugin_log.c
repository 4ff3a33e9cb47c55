/* The logger oxccl passes to a network plugin's init: a C-variadic
 * function (level, subsystem flags, file, line, printf format, args...).
 * It formats the message into a bounded buffer and hands it, with the
 * level and place, to the sink Rust installed (which forwards it to
 * tracing). Nothing here keeps state but the sink pointer. */
#include <stdarg.h>
#include <stdio.h>

typedef void (*oxccl_net_log_sink)(int level, unsigned long flags, const char *file, int line,
                                   const char *msg);

static oxccl_net_log_sink sink;

void oxccl_net_set_log_sink(oxccl_net_log_sink s) { __atomic_store_n(&sink, s, __ATOMIC_RELEASE); }

void oxccl_net_plugin_log(int level, unsigned long flags, const char *file, int line,
                          const char *fmt, ...) {
    char msg[1024];
    oxccl_net_log_sink s = __atomic_load_n(&sink, __ATOMIC_ACQUIRE);
    if (s == 0) return;
    msg[0] = '\0';
    if (fmt != 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
    }
    s(level, flags, file, line, msg);
}

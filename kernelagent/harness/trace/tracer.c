/* kernelagent's kernel tracer: a CUPTI injection library (issue 55; the record format is the
 * contract in docs: TRACE_SPEC / docs/concepts/trace.md).
 *
 * The CUDA driver loads this library at cuInit when CUDA_INJECTION64_PATH names it, and calls
 * InitializeInjection before any kernel of the process can run. It enables CUPTI's activity API
 * for kernels (concurrent mode), copies and sets, and writes one JSON line per record to the
 * pipe whose write end is KERNELAGENT_TRACE_FD. The pipe is non-blocking: a record that cannot be
 * written within a short wait is counted as dropped and reported in a `dropped` record, so a
 * server that stops reading never hangs the process. Both variables are unset at injection, so
 * processes this one starts are not traced.
 *
 * kernelagent_trace_mark launches the marker kernel (`kernelagent_trace_marker`, PTX loaded
 * through the driver API) on a stream, grid (index+1, phase, 1|2); kernelagent_trace_flush
 * synchronises the current context, flushes CUPTI's buffers and writes a `flush` record after
 * every record of the work before it.
 *
 * Built on first use by build.py: cc -shared -fPIC -O2, with the CUPTI headers and cuda.h. */
#define _GNU_SOURCE
#include <cupti.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* build.py passes the newest record structs the CUPTI headers define (they are versioned and the
 * library fills the newest its headers know). */
#ifndef KA_KERNEL_T
#define KA_KERNEL_T CUpti_ActivityKernel9
#endif
#ifndef KA_MEMCPY_T
#define KA_MEMCPY_T CUpti_ActivityMemcpy6
#endif
#ifndef KA_MEMSET_T
#define KA_MEMSET_T CUpti_ActivityMemset4
#endif

#define KA_EXPORT __attribute__((visibility("default")))
#define KA_LINE_MAX 1024
#define KA_NAME_MAX 512
#define KA_CHUNK 4096            /* <= PIPE_BUF: one write() of a chunk is atomic on a pipe */
#define KA_BUFFER_BYTES (4u << 20)
#define KA_WAIT_MS 200           /* the longest one write waits for the reader before dropping */
#define KA_MAX_CTX 16

static int g_fd = -1;
static int g_enabled = 0;
static uint64_t g_seq = 0;
static uint64_t g_dropped = 0;          /* records lost (CUPTI's and the channel's) */
static uint64_t g_dropped_reported = 0;
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;

/* The pending chunk: whole lines, written at once. `g_pending_n` lines, first seq g_seq. */
static char g_chunk[KA_CHUNK];
static size_t g_chunk_len = 0;
static uint64_t g_pending_n = 0;

/* ---------------------------------------------------------------------------------------- */
/* The channel                                                                               */
/* ---------------------------------------------------------------------------------------- */

static int write_all_or_drop(const char *data, size_t len) {
  /* One chunk of whole lines (<= PIPE_BUF). Returns 1 when written, 0 when dropped. */
  size_t done = 0;
  int waited = 0;
  while (done < len) {
    ssize_t n = write(g_fd, data + done, len - done);
    if (n > 0) {
      done += (size_t)n;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (done == 0 && waited >= KA_WAIT_MS) return 0;
      struct pollfd p = {g_fd, POLLOUT, 0};
      int r = poll(&p, 1, 20);
      waited += 20;
      if (r < 0 && errno != EINTR) return done ? 1 : 0;
      /* A partial line (not a pipe) is finished whatever the wait: never half a record. */
      continue;
    }
    return done ? 1 : 0; /* EPIPE, EBADF: the reader is gone */
  }
  return 1;
}

static void chunk_send_locked(void) {
  if (!g_chunk_len) return;
  if (write_all_or_drop(g_chunk, g_chunk_len)) {
    g_seq += g_pending_n;
  } else {
    g_dropped += g_pending_n;
  }
  g_chunk_len = 0;
  g_pending_n = 0;
}

/* Append one record; `body` is the record's fields after "seq" (starting with ,"t":...). */
static void emit_locked(const char *body) {
  char line[KA_LINE_MAX + 1];
  if (g_fd < 0) return;
  int n = snprintf(line, sizeof line, "{\"seq\":%llu%s}\n",
                   (unsigned long long)(g_seq + g_pending_n), body);
  if (n <= 0 || n > KA_LINE_MAX) {
    g_dropped += 1;
    return;
  }
  if (g_chunk_len + (size_t)n > KA_CHUNK) {
    chunk_send_locked();
    /* the seq of this line moves with what was sent or dropped */
    n = snprintf(line, sizeof line, "{\"seq\":%llu%s}\n", (unsigned long long)g_seq, body);
  }
  memcpy(g_chunk + g_chunk_len, line, (size_t)n);
  g_chunk_len += (size_t)n;
  g_pending_n += 1;
}

static void report_dropped_locked(void) {
  if (g_dropped > g_dropped_reported) {
    char body[96];
    uint64_t delta = g_dropped - g_dropped_reported;
    g_dropped_reported = g_dropped;
    snprintf(body, sizeof body, ",\"t\":\"dropped\",\"n\":%llu", (unsigned long long)delta);
    emit_locked(body);
  }
}

/* The kernel's name as a JSON string's content: printable ASCII, `"` `\` and the rest as \u00XX,
 * at most KA_NAME_MAX bytes of output (a cut falls between two whole characters). */
static void clean_name(const char *name, char *out, size_t cap) {
  static const char hex[] = "0123456789abcdef";
  size_t o = 0;
  if (cap > KA_NAME_MAX + 1) cap = KA_NAME_MAX + 1;
  for (const unsigned char *p = (const unsigned char *)(name ? name : ""); *p; p++) {
    unsigned char c = *p;
    if (c >= 0x20 && c < 0x7f && c != '"' && c != '\\') {
      if (o + 1 >= cap) break;
      out[o++] = (char)c;
    } else {
      if (o + 6 >= cap) break;
      out[o++] = '\\'; out[o++] = 'u'; out[o++] = '0'; out[o++] = '0';
      out[o++] = hex[c >> 4]; out[o++] = hex[c & 15];
    }
  }
  out[o] = 0;
}

/* ---------------------------------------------------------------------------------------- */
/* CUPTI's buffers                                                                            */
/* ---------------------------------------------------------------------------------------- */

static void CUPTIAPI buffer_requested(uint8_t **buffer, size_t *size, size_t *max_records) {
  void *p = NULL;
  if (posix_memalign(&p, 8, KA_BUFFER_BYTES) != 0) p = NULL;
  *buffer = (uint8_t *)p;
  *size = p ? KA_BUFFER_BYTES : 0;
  *max_records = 0;
}

static void record_locked(CUpti_Activity *rec) {
  char body[KA_LINE_MAX];
  switch (rec->kind) {
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL:
    case CUPTI_ACTIVITY_KIND_KERNEL: {
      KA_KERNEL_T *k = (KA_KERNEL_T *)rec;
      char name[KA_NAME_MAX + 1];
      clean_name(k->name, name, sizeof name);
      snprintf(body, sizeof body,
               ",\"t\":\"kernel\",\"name\":\"%s\",\"corr\":%u,\"ctx\":%u,\"dev\":%u,\"stream\":%u,"
               "\"grid\":[%d,%d,%d],\"block\":[%d,%d,%d],\"start\":%llu,\"end\":%llu,\"graph\":%u",
               name, k->correlationId, k->contextId, k->deviceId, k->streamId, k->gridX, k->gridY,
               k->gridZ, k->blockX, k->blockY, k->blockZ, (unsigned long long)k->start,
               (unsigned long long)k->end, k->graphId);
      emit_locked(body);
      break;
    }
    case CUPTI_ACTIVITY_KIND_MEMCPY: {
      KA_MEMCPY_T *m = (KA_MEMCPY_T *)rec;
      snprintf(body, sizeof body,
               ",\"t\":\"memcpy\",\"kind\":%u,\"bytes\":%llu,\"ctx\":%u,\"dev\":%u,\"stream\":%u,"
               "\"start\":%llu,\"end\":%llu,\"corr\":%u",
               (unsigned)m->copyKind, (unsigned long long)m->bytes, m->contextId, m->deviceId,
               m->streamId, (unsigned long long)m->start, (unsigned long long)m->end,
               m->correlationId);
      emit_locked(body);
      break;
    }
    case CUPTI_ACTIVITY_KIND_MEMSET: {
      KA_MEMSET_T *m = (KA_MEMSET_T *)rec;
      snprintf(body, sizeof body,
               ",\"t\":\"memset\",\"bytes\":%llu,\"ctx\":%u,\"dev\":%u,\"stream\":%u,"
               "\"start\":%llu,\"end\":%llu,\"corr\":%u",
               (unsigned long long)m->bytes, m->contextId, m->deviceId, m->streamId,
               (unsigned long long)m->start, (unsigned long long)m->end, m->correlationId);
      emit_locked(body);
      break;
    }
    default:
      break;
  }
}

static void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream_id, uint8_t *buffer,
                                      size_t size, size_t valid) {
  CUpti_Activity *rec = NULL;
  pthread_mutex_lock(&g_lock);
  if (valid > 0) {
    while (cuptiActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS) record_locked(rec);
  }
  size_t lost = 0;
  if (cuptiActivityGetNumDroppedRecords(ctx, stream_id, &lost) == CUPTI_SUCCESS && lost > 0)
    g_dropped += lost;
  report_dropped_locked();
  chunk_send_locked();
  pthread_mutex_unlock(&g_lock);
  free(buffer);
  (void)size;
}

/* ---------------------------------------------------------------------------------------- */
/* Injection                                                                                  */
/* ---------------------------------------------------------------------------------------- */

static int take_fd(void) {
  const char *s = getenv("KERNELAGENT_TRACE_FD");
  if (!s || !*s) return -1;
  char *end = NULL;
  long v = strtol(s, &end, 10);
  if (*end || v < 3 || v > 65535) return -1;
  int fd = (int)v;
  struct stat st;
  /* Only a pipe (the server's channel) or a character device (/dev/null): a variable inherited by
   * a process it was not meant for never turns an unrelated file of its into a trace. */
  if (fstat(fd, &st) != 0 || !(S_ISFIFO(st.st_mode) || S_ISCHR(st.st_mode))) return -1;
  int fl = fcntl(fd, F_GETFL);
  if (fl < 0 || (fl & O_ACCMODE) == O_RDONLY) return -1;
  if (fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0) return -1;
  int fdfl = fcntl(fd, F_GETFD);
  if (fdfl >= 0) fcntl(fd, F_SETFD, fdfl | FD_CLOEXEC);
#ifdef F_SETPIPE_SZ
  fcntl(fd, F_SETPIPE_SZ, 1 << 20); /* best effort: more room before a record can drop */
#endif
  return fd;
}

KA_EXPORT int InitializeInjection(void) {
  static int done = 0;
  if (done) return 1;
  done = 1;
  int fd = take_fd();
  unsetenv("KERNELAGENT_TRACE_FD");
  unsetenv("CUDA_INJECTION64_PATH");
  if (fd < 0) return 1; /* nothing to write to: load, trace nothing */
  pthread_mutex_lock(&g_lock);
  g_fd = fd;
  pthread_mutex_unlock(&g_lock);
  if (cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed) != CUPTI_SUCCESS)
    return 1;
  if (cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS) return 1;
  cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY);
  cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMSET);
  uint32_t version = 0;
  uint64_t ts = 0;
  cuptiGetVersion(&version);
  cuptiGetTimestamp(&ts);
  char body[160];
  snprintf(body, sizeof body, ",\"t\":\"hello\",\"v\":1,\"pid\":%ld,\"cupti\":%u,\"ts\":%llu",
           (long)getpid(), version, (unsigned long long)ts);
  pthread_mutex_lock(&g_lock);
  g_enabled = 1;
  emit_locked(body);
  chunk_send_locked();
  pthread_mutex_unlock(&g_lock);
  return 1;
}

/* ---------------------------------------------------------------------------------------- */
/* Markers, through the driver API                                                            */
/* ---------------------------------------------------------------------------------------- */

typedef CUresult (*ka_ctx_get_current_t)(CUcontext *);
typedef CUresult (*ka_ctx_synchronize_t)(void);
typedef CUresult (*ka_module_load_data_t)(CUmodule *, const void *);
typedef CUresult (*ka_module_get_function_t)(CUfunction *, CUmodule, const char *);
typedef CUresult (*ka_launch_kernel_t)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                                       unsigned, unsigned, CUstream, void **, void **);

static ka_ctx_get_current_t p_ctx_get_current;
static ka_ctx_synchronize_t p_ctx_synchronize;
static ka_module_load_data_t p_module_load_data;
static ka_module_get_function_t p_module_get_function;
static ka_launch_kernel_t p_launch_kernel;
static pthread_mutex_t g_driver_lock = PTHREAD_MUTEX_INITIALIZER;
static int g_driver_state = 0; /* 0 not tried, 1 ready, -1 missing */
static struct { CUcontext ctx; CUfunction fn; } g_markers[KA_MAX_CTX];
static int g_n_markers = 0;

static const char MARKER_PTX[] =
    ".version 6.0\n"
    ".target sm_50\n"
    ".address_size 64\n"
    ".visible .entry kernelagent_trace_marker()\n"
    "{\n"
    "  ret;\n"
    "}\n";

static int driver_ready_locked(void) {
  if (g_driver_state) return g_driver_state > 0;
  void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (!h) h = dlopen("libcuda.so.1", RTLD_NOW);
  if (h) {
    p_ctx_get_current = (ka_ctx_get_current_t)dlsym(h, "cuCtxGetCurrent");
    p_ctx_synchronize = (ka_ctx_synchronize_t)dlsym(h, "cuCtxSynchronize");
    p_module_load_data = (ka_module_load_data_t)dlsym(h, "cuModuleLoadData");
    p_module_get_function = (ka_module_get_function_t)dlsym(h, "cuModuleGetFunction");
    p_launch_kernel = (ka_launch_kernel_t)dlsym(h, "cuLaunchKernel");
  }
  g_driver_state = (h && p_ctx_get_current && p_ctx_synchronize && p_module_load_data &&
                    p_module_get_function && p_launch_kernel) ? 1 : -1;
  return g_driver_state > 0;
}

static CUfunction marker_for_locked(CUcontext ctx, int *err) {
  for (int i = 0; i < g_n_markers; i++)
    if (g_markers[i].ctx == ctx) return g_markers[i].fn;
  if (g_n_markers >= KA_MAX_CTX) { *err = -3; return NULL; }
  CUmodule mod = NULL;
  CUfunction fn = NULL;
  CUresult r = p_module_load_data(&mod, MARKER_PTX);
  if (r == CUDA_SUCCESS) r = p_module_get_function(&fn, mod, "kernelagent_trace_marker");
  if (r != CUDA_SUCCESS || !fn) { *err = (int)r ? (int)r : -4; return NULL; }
  g_markers[g_n_markers].ctx = ctx;
  g_markers[g_n_markers].fn = fn;
  g_n_markers++;
  return fn;
}

/* 0 when launched; -1 no tracer, -2 no driver, -3 too many contexts, else the CUresult. */
KA_EXPORT int kernelagent_trace_mark(uint64_t stream, unsigned phase, unsigned index, int end) {
  if (!g_enabled) return -1;
  if (phase < 1 || phase > 65535 || index >= 0x7ffffffeu) return -5;
  pthread_mutex_lock(&g_driver_lock);
  int err = 0;
  CUcontext ctx = NULL;
  CUfunction fn = NULL;
  if (!driver_ready_locked()) err = -2;
  else if (p_ctx_get_current(&ctx) != CUDA_SUCCESS || !ctx) err = -6;
  else fn = marker_for_locked(ctx, &err);
  pthread_mutex_unlock(&g_driver_lock);
  if (!fn) return err ? err : -4;
  CUresult r = p_launch_kernel(fn, index + 1, phase, end ? 2 : 1, 1, 1, 1, 0,
                               (CUstream)(uintptr_t)stream, NULL, NULL);
  return r == CUDA_SUCCESS ? 0 : (int)r;
}

/* Synchronise the current context, deliver every buffer, then write the flush record (after all
 * the records of the work before it). 0 when written; -1 no tracer. */
KA_EXPORT int kernelagent_trace_flush(unsigned mark, int final) {
  if (!g_enabled) return -1;
  pthread_mutex_lock(&g_driver_lock);
  int ready = driver_ready_locked();
  pthread_mutex_unlock(&g_driver_lock);
  if (ready) p_ctx_synchronize();
  cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  uint64_t ts = 0;
  cuptiGetTimestamp(&ts);
  char body[128];
  snprintf(body, sizeof body, ",\"t\":\"flush\",\"mark\":%u,\"final\":%d,\"ts\":%llu", mark,
           final ? 1 : 0, (unsigned long long)ts);
  pthread_mutex_lock(&g_lock);
  report_dropped_locked();
  emit_locked(body);
  chunk_send_locked();
  pthread_mutex_unlock(&g_lock);
  return 0;
}

/* The totals, for the probe: records written and records dropped. */
KA_EXPORT void kernelagent_trace_counts(uint64_t *written, uint64_t *dropped) {
  pthread_mutex_lock(&g_lock);
  if (written) *written = g_seq;
  if (dropped) *dropped = g_dropped;
  pthread_mutex_unlock(&g_lock);
}

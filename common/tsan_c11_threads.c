/* ThreadSanitizer builds only (RANKWATCH_SANITIZE=thread; linked into every target there).
 *
 * Debian's librdkafka creates its threads and takes its locks through C11 <threads.h>
 * (thrd_create, mtx_lock, cnd_wait). glibc implements those by calling its internal pthread
 * functions directly, not through the symbols ThreadSanitizer intercepts (GCC 12's TSan has no
 * C11 thread interceptors), so TSan never learns that such a thread exists: the thread's first
 * intercepted call (malloc) reads TSan's per-thread state at a null base, a SEGV at a zero-page
 * address. Its locks are invisible as well, so a callback run on a librdkafka thread and the code
 * that later reads what it wrote would be reported as racing even when a librdkafka mutex orders
 * them.
 *
 * These definitions in the executable interpose glibc's (an executable's symbols come first in
 * the dynamic lookup) and map each C11 call onto the pthread call TSan intercepts. The mapping
 * is the one glibc itself makes; only the route changes. */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <threads.h>

_Static_assert(sizeof(mtx_t) >= sizeof(pthread_mutex_t), "mtx_t holds a pthread mutex");
_Static_assert(sizeof(cnd_t) >= sizeof(pthread_cond_t), "cnd_t holds a pthread condvar");
_Static_assert(sizeof(thrd_t) == sizeof(pthread_t), "thrd_t is a pthread_t");

static int ThreadResult(int err) {
  switch (err) {
    case 0: return thrd_success;
    case EBUSY: return thrd_busy;
    case ENOMEM: return thrd_nomem;
    case ETIMEDOUT: return thrd_timedout;
    default: return thrd_error;
  }
}

struct ThreadStart {
  thrd_start_t func;
  void* arg;
};

static void* RunThread(void* p) {
  struct ThreadStart start = *(struct ThreadStart*)p;
  free(p);
  return (void*)(intptr_t)start.func(start.arg);
}

int thrd_create(thrd_t* thr, thrd_start_t func, void* arg) {
  struct ThreadStart* start = malloc(sizeof(*start));
  if (start == NULL) return thrd_nomem;
  start->func = func;
  start->arg = arg;
  const int err = pthread_create((pthread_t*)thr, NULL, RunThread, start);
  if (err != 0) free(start);
  return ThreadResult(err);
}

int thrd_join(thrd_t thr, int* res) {
  void* value = NULL;
  const int err = pthread_join((pthread_t)thr, &value);
  if (err == 0 && res != NULL) *res = (int)(intptr_t)value;
  return ThreadResult(err);
}

int thrd_detach(thrd_t thr) { return ThreadResult(pthread_detach((pthread_t)thr)); }

int mtx_init(mtx_t* m, int type) {
  pthread_mutexattr_t attr;
  pthread_mutexattr_init(&attr);
  if (type & mtx_recursive) pthread_mutexattr_settype(&attr, PTHREAD_MUTEX_RECURSIVE);
  const int err = pthread_mutex_init((pthread_mutex_t*)m, &attr);
  pthread_mutexattr_destroy(&attr);
  return ThreadResult(err);
}

int mtx_lock(mtx_t* m) { return ThreadResult(pthread_mutex_lock((pthread_mutex_t*)m)); }

int mtx_trylock(mtx_t* m) { return ThreadResult(pthread_mutex_trylock((pthread_mutex_t*)m)); }

int mtx_timedlock(mtx_t* restrict m, const struct timespec* restrict deadline) {
  return ThreadResult(pthread_mutex_timedlock((pthread_mutex_t*)m, deadline));
}

int mtx_unlock(mtx_t* m) { return ThreadResult(pthread_mutex_unlock((pthread_mutex_t*)m)); }

void mtx_destroy(mtx_t* m) { pthread_mutex_destroy((pthread_mutex_t*)m); }

int cnd_init(cnd_t* c) { return ThreadResult(pthread_cond_init((pthread_cond_t*)c, NULL)); }

int cnd_signal(cnd_t* c) { return ThreadResult(pthread_cond_signal((pthread_cond_t*)c)); }

int cnd_broadcast(cnd_t* c) { return ThreadResult(pthread_cond_broadcast((pthread_cond_t*)c)); }

int cnd_wait(cnd_t* c, mtx_t* m) {
  return ThreadResult(pthread_cond_wait((pthread_cond_t*)c, (pthread_mutex_t*)m));
}

int cnd_timedwait(cnd_t* restrict c, mtx_t* restrict m, const struct timespec* restrict deadline) {
  return ThreadResult(pthread_cond_timedwait((pthread_cond_t*)c, (pthread_mutex_t*)m, deadline));
}

void cnd_destroy(cnd_t* c) { pthread_cond_destroy((pthread_cond_t*)c); }

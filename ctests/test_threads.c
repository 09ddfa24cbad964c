/*
 * Eight threads hammering one store through the C API (libmxkv's store is
 * safe to call from many threads; MXNet's is not). Each phase runs a bounded
 * number of iterations under a watchdog (a phase that does not finish in
 * MXKV_TEST_TIMEOUT seconds, default 60, is reported as a deadlock):
 *
 *   A  concurrent pushes (one and several values, int keys) through an updater
 *      that adds recv into local, pulls and PushPulls in between: the final
 *      sums and the number of updater calls are exact, every pull sees a
 *      consistent, non-decreasing value; per-thread error messages.
 *   B  concurrent Init / Broadcast of distinct keys and races on the same keys
 *      (local and device), with multi-value pushes in between: exactly one
 *      winner per key, no partial multi-key init, exact sums.
 *   C  string keys from several threads: InitEx races, PushEx through a string
 *      updater, internal ids unique and dense.
 *   D  concurrent create / copy / share / save / load / free of arrays.
 *   E  threads freeing handles while others use them (and racing double
 *      frees): only rc 0 or -1 "stale", never a crash or a leak.
 *   F  a store freed while seven threads push and pull on it.
 *   G  updaters that pull *other* keys while other threads update those keys
 *      (must not deadlock); MXKV_TEST_CROSS_PUSH=1 also pushes to them.
 *   H  row_sparse values adopted by the store without a copy while their
 *      owners overwrite and free them: pulls see whole pushed values only.
 *   I  calls that used to wait on a lock their own thread held: a row_sparse
 *      array copied into a handle on its own data part, an updater pulling
 *      its key into local's data part (local and device).
 *
 * MXKV_TEST_ITERS sets the iterations (default 400 per thread and phase);
 * MXKV_TEST_PHASES=ABC… runs only those phases; MXKV_TEST_VERBOSE=1 prints
 * the expected error messages and phase statistics.
 *
 * Built and run by `make ctest` (also ctest-asan, ctest-valgrind). By hand,
 * after `make build` (which stages build/lib/libmxkv.so.0, the soname):
 *   gcc -std=c11 -Wall -Wextra -Wpedantic -Werror -D_GNU_SOURCE -Iinclude \
 *       ctests/test_threads.c -Lbuild/lib -lmxkv -Wl,-rpath,$PWD/build/lib \
 *       -lpthread -o /tmp/test_threads && /tmp/test_threads
 */
#include "check.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <time.h>
#include <unistd.h>

#define NT 8    /* threads */
#define NEL 16  /* elements per value in phases A, G */
#define NKEYS 4 /* keys in phase A */

static int g_iters = 400;
static int g_timeout = 60;
static pthread_barrier_t g_barrier;

/* ------------------------------------------------------------- plumbing */

static pthread_mutex_t wd_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t wd_cv = PTHREAD_COND_INITIALIZER;
static bool wd_done;
static const char *wd_phase;

static void *watchdog(void *arg) {
  (void)arg;
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_sec += g_timeout;
  pthread_mutex_lock(&wd_mu);
  while (!wd_done) {
    if (pthread_cond_timedwait(&wd_cv, &wd_mu, &until) == ETIMEDOUT && !wd_done) {
      fprintf(stderr, "test_threads: phase %s did not finish within %d s (deadlock?)\n", wd_phase,
              g_timeout);
      _exit(3);
    }
  }
  pthread_mutex_unlock(&wd_mu);
  return NULL;
}

typedef struct {
  int t;
  void *ctx;
} targ;

/* Runs fn on n threads (started together) under the watchdog. */
static void run_threads(const char *phase, void *(*fn)(void *), int n, void *ctx) {
  pthread_t wd, th[NT];
  targ args[NT];
  CHECK(n <= NT);
  wd_done = false;
  wd_phase = phase;
  CHECK(pthread_create(&wd, NULL, watchdog, NULL) == 0);
  CHECK(pthread_barrier_init(&g_barrier, NULL, (unsigned)n) == 0);
  for (int t = 0; t < n; t++) {
    args[t] = (targ){t, ctx};
    CHECK(pthread_create(&th[t], NULL, fn, &args[t]) == 0);
  }
  for (int t = 0; t < n; t++) CHECK(pthread_join(th[t], NULL) == 0);
  CHECK(pthread_barrier_destroy(&g_barrier) == 0);
  pthread_mutex_lock(&wd_mu);
  wd_done = true;
  pthread_cond_signal(&wd_cv);
  pthread_mutex_unlock(&wd_mu);
  CHECK(pthread_join(wd, NULL) == 0);
}

static void start_together(void) {
  int rc = pthread_barrier_wait(&g_barrier);
  CHECK(rc == 0 || rc == PTHREAD_BARRIER_SERIAL_THREAD);
}

static uint32_t rnd(uint32_t *s) {
  *s ^= *s << 13;
  *s ^= *s >> 17;
  *s ^= *s << 5;
  return *s;
}

static void fill(float *v, size_t n, float x) {
  for (size_t i = 0; i < n; i++) v[i] = x;
}

/* A pulled value: all elements equal (a consistent snapshot), an integer, and
   not below what this thread saw before for the key. Returns it. */
static float check_uniform_at(int line, NDArrayHandle out, float *last) {
  float v[NEL];
  read_f32(out, v, NEL);
  for (int i = 1; i < NEL; i++) {
    if (v[i] != v[0]) {
      fprintf(stderr, "test_threads.c:%d: torn value: element %d is %g, element 0 is %g\n", line, i,
              (double)v[i], (double)v[0]);
      exit(1);
    }
  }
  if (v[0] != (float)(long)v[0] || (last != NULL && v[0] < *last)) {
    fprintf(stderr, "test_threads.c:%d: pulled %g after %g\n", line, (double)v[0],
            last ? (double)*last : 0.0);
    exit(1);
  }
  if (last != NULL) *last = v[0];
  return v[0];
}
#define check_uniform(out, last) check_uniform_at(__LINE__, out, last)

static _Thread_local int tl_pushing; /* this thread is inside a push */

/* local += recv for NEL-element float32 values; frees both handles. */
static _Atomic long g_add_calls;
static void add_updater(int key, NDArrayHandle recv, NDArrayHandle local, void *user) {
  CHECK(tl_pushing); /* called on the pushing thread, during the push */
  CHECK(user == (void *)&g_add_calls);
  CHECK(key >= 0 && key < 1000);
  float r[NEL], l[NEL];
  read_f32(recv, r, NEL);
  read_f32(local, l, NEL);
  for (int i = 0; i < NEL; i++) l[i] += r[i];
  CHECK_OK(MXNDArraySyncCopyFromCPU(local, l, NEL));
  CHECK_OK(MXNDArrayFree(recv));
  CHECK_OK(MXNDArrayFree(local));
  atomic_fetch_add(&g_add_calls, 1);
}

/* ------------------------------------------------------------ phase A */

typedef struct {
  KVStoreHandle kv;
  long contrib[NT][NKEYS];
  long calls[NT];
} phase_a;

static void *phase_a_thread(void *arg) {
  targ *a = arg;
  int t = a->t;
  phase_a *p = a->ctx;
  float v[NEL];
  fill(v, NEL, 1);
  NDArrayHandle one = make_f32(NEL, v);
  fill(v, NEL, 2);
  NDArrayHandle two = make_f32(NEL, v);
  fill(v, NEL, 3);
  NDArrayHandle three = make_f32(NEL, v);
  fill(v, NEL, (float)(t + 1));
  NDArrayHandle mine = make_f32(NEL, v);
  NDArrayHandle out = make_f32(NEL, NULL), out2 = make_f32(NEL, NULL);
  float last[NKEYS] = {0};
  char want[64];
  int bad = 900 + t;
  snprintf(want, sizeof want, "MXKVStorePull: key %d has not been inited", bad);
  start_together();
  for (int i = 0; i < g_iters; i++) {
    int k = (t + i) % NKEYS, k2 = (k + 1) % NKEYS, kp = (k + 2) % NKEYS;
    tl_pushing = 1;
    switch (i % 4) {
      case 0: /* one value */
        CHECK_OK(MXKVStorePush(p->kv, 1, &k, &mine, i - 50));
        p->contrib[t][k] += t + 1;
        p->calls[t] += 1;
        break;
      case 1: { /* several values, two keys */
        int ks[4] = {k, k2, k, k};
        NDArrayHandle vs[4] = {one, three, two, mine};
        CHECK_OK(MXKVStorePush(p->kv, 4, ks, vs, 0));
        p->contrib[t][k] += 1 + 2 + t + 1;
        p->contrib[t][k2] += 3;
        p->calls[t] += 2;
        break;
      }
      case 2: /* PushPull */
        CHECK_OK(MXKVStorePushPull(p->kv, 2, (int[]){k, k}, 1, &k, (NDArrayHandle[]){one, two}, &out, 0));
        p->contrib[t][k] += 3;
        p->calls[t] += 1;
        check_uniform(out, &last[k]);
        break;
      case 3: { /* a fresh array for each push: registry churn */
        NDArrayHandle tmp = make_f32(NEL, v);
        CHECK_OK(MXKVStorePush(p->kv, 1, &k2, &tmp, 0));
        CHECK_OK(MXNDArrayFree(tmp));
        p->contrib[t][k2] += t + 1;
        p->calls[t] += 1;
        break;
      }
    }
    tl_pushing = 0;
    CHECK_OK(MXKVStorePull(p->kv, 2, (int[]){kp, kp}, (NDArrayHandle[]){out, out2}, 0));
    check_uniform(out, &last[kp]);
    check_uniform(out2, &last[kp]);
    /* errors are per thread: this thread's message names its own key */
    CHECK_ERR(MXKVStorePull(p->kv, 1, &bad, &out, 0), want);
  }
  NDArrayHandle hs[6] = {one, two, three, mine, out, out2};
  for (int i = 0; i < 6; i++) CHECK_OK(MXNDArrayFree(hs[i]));
  return NULL;
}

static void run_phase_a(const char *type) {
  static phase_a p;
  memset(&p, 0, sizeof p);
  CHECK_OK(MXKVStoreCreate(type, &p.kv));
  NDArrayHandle z = make_f32(NEL, NULL);
  int keys[NKEYS] = {0, 1, 2, 3};
  CHECK_OK(MXKVStoreInit(p.kv, NKEYS, keys, (NDArrayHandle[]){z, z, z, z}));
  atomic_store(&g_add_calls, 0);
  CHECK_OK(MXKVStoreSetUpdater(p.kv, add_updater, (void *)&g_add_calls));
  char name[64];
  snprintf(name, sizeof name, "A (pushes and pulls, %s)", type);
  run_threads(name, phase_a_thread, NT, &p);
  long calls = 0;
  for (int t = 0; t < NT; t++) calls += p.calls[t];
  CHECK(atomic_load(&g_add_calls) == calls);
  for (int k = 0; k < NKEYS; k++) {
    long sum = 0;
    for (int t = 0; t < NT; t++) sum += p.contrib[t][k];
    float want[NEL];
    fill(want, NEL, (float)sum);
    CHECK(sum < (1L << 24)); /* exact in float32 */
    CHECK_OK(MXKVStorePull(p.kv, 1, &k, &z, 0));
    CHECK_F32V(z, NEL, want);
  }
  CHECK_OK(MXNDArrayFree(z));
  CHECK_OK(MXKVStoreFree(p.kv));
}

/* ------------------------------------------------------------ phase B */

#define NB 96
typedef struct {
  KVStoreHandle kv;
  _Atomic int init_wins[NB], init_owner[NB];
  _Atomic int bc_wins[NB], bc_owner[NB];
  _Atomic int pair_ok[NT][NB]; /* thread t's init of the pair (j, j+1) succeeded */
} phase_b;

static void *phase_b_thread(void *arg) {
  targ *a = arg;
  int t = a->t;
  phase_b *p = a->ctx;
  NDArrayHandle out = make_f32(2, NULL);
  char want[96];
  start_together();
  for (int j = 0; j < NB; j++) {
    const float v[2] = {(float)t, (float)j};
    NDArrayHandle h = make_f32(2, v);
    int own = 10000 + t * 100 + j;
    CHECK_OK(MXKVStoreInit(p->kv, 1, &own, &h));
    /* a multi-value push while other threads add keys (device: merge buffers) */
    CHECK_OK(MXKVStorePush(p->kv, 2, (int[]){own, own}, (NDArrayHandle[]){h, h}, 0));
    CHECK_OK(MXKVStorePull(p->kv, 1, &own, &out, 0));
    CHECK_F32(out, 2, (float)(2 * t), (float)(2 * j));
    /* everybody initialises the same key: one winner */
    int shared = 50000 + j;
    if (MXKVStoreInit(p->kv, 1, &shared, &h) == 0) {
      atomic_fetch_add(&p->init_wins[j], 1);
      atomic_store(&p->init_owner[j], t);
    } else {
      snprintf(want, sizeof want, "MXKVStoreInit: duplicate init of key %d.", shared);
      CHECK(strstr(MXGetLastError(), want) != NULL);
    }
    /* Broadcast races: the winner's output holds its value */
    int bk = 60000 + j;
    if (MXKVStoreBroadcast(p->kv, 1, &bk, 1, &bk, &h, &out, 0) == 0) {
      atomic_fetch_add(&p->bc_wins[j], 1);
      atomic_store(&p->bc_owner[j], t);
      CHECK_F32(out, 2, (float)t, (float)j);
    } else {
      snprintf(want, sizeof want, "MXKVStoreBroadcast: duplicate init of key %d.", bk);
      CHECK(strstr(MXGetLastError(), want) != NULL);
    }
    /* overlapping pairs: all or nothing */
    int pair[2] = {80000 + j, 80000 + j + 1};
    if (MXKVStoreInit(p->kv, 2, pair, (NDArrayHandle[]){h, h}) == 0)
      atomic_store(&p->pair_ok[t][j], 1);
    else
      CHECK(strstr(MXGetLastError(), "duplicate init of key 8") != NULL);
    /* pulls of keys initialised by others, as they appear */
    int other = 10000 + ((t + 1) % NT) * 100 + j;
    int rc = MXKVStorePull(p->kv, 1, &other, &out, 0);
    if (rc == 0) {
      float ov[2];
      read_f32(out, ov, 2);
      int ot = (t + 1) % NT;
      CHECK((ov[0] == (float)ot && ov[1] == (float)j) || (ov[0] == (float)(2 * ot) && ov[1] == (float)(2 * j)));
    } else
      CHECK(strstr(MXGetLastError(), "has not been inited") != NULL);
    CHECK_OK(MXNDArrayFree(h));
  }
  CHECK_OK(MXNDArrayFree(out));
  return NULL;
}

static void run_phase_b(const char *type) {
  static phase_b p;
  memset(&p, 0, sizeof p);
  CHECK_OK(MXKVStoreCreate(type, &p.kv));
  char name[64];
  snprintf(name, sizeof name, "B (concurrent init, %s)", type);
  run_threads(name, phase_b_thread, NT, &p);
  NDArrayHandle out = make_f32(2, NULL);
  for (int j = 0; j < NB; j++) {
    CHECK(atomic_load(&p.init_wins[j]) == 1);
    CHECK(atomic_load(&p.bc_wins[j]) == 1);
    for (int t = 0; t < NT; t++) {
      int own = 10000 + t * 100 + j;
      CHECK_OK(MXKVStorePull(p.kv, 1, &own, &out, 0));
      CHECK_F32(out, 2, (float)(2 * t), (float)(2 * j));
    }
    int k = 50000 + j;
    CHECK_OK(MXKVStorePull(p.kv, 1, &k, &out, 0));
    CHECK_F32(out, 2, (float)atomic_load(&p.init_owner[j]), (float)j);
    k = 60000 + j;
    CHECK_OK(MXKVStorePull(p.kv, 1, &k, &out, 0));
    CHECK_F32(out, 2, (float)atomic_load(&p.bc_owner[j]), (float)j);
  }
  /* pairs: every successful call owns both its keys; no key holds a value
     from a call that failed (that would be a partial init) */
  for (int q = 80000; q <= 80000 + NB; q++) {
    float v[2];
    if (MXKVStorePull(p.kv, 1, &q, &out, 0) != 0) {
      CHECK(strstr(MXGetLastError(), "has not been inited") != NULL);
      continue;
    }
    read_f32(out, v, 2);
    int t = (int)v[0], j = (int)v[1];
    CHECK(t >= 0 && t < NT && (80000 + j == q || 80000 + j + 1 == q));
    CHECK(atomic_load(&p.pair_ok[t][j]) == 1);
  }
  for (int t = 0; t < NT; t++) {
    for (int j = 0; j < NB; j++) {
      if (!atomic_load(&p.pair_ok[t][j])) continue;
      for (int q = 80000 + j; q <= 80000 + j + 1; q++) {
        CHECK_OK(MXKVStorePull(p.kv, 1, &q, &out, 0));
        CHECK_F32(out, 2, (float)t, (float)j);
      }
    }
  }
  CHECK_OK(MXNDArrayFree(out));
  CHECK_OK(MXKVStoreFree(p.kv));
}

static void run_phase_b_both(void) {
  run_phase_b("local");
  run_phase_b("device");
}

/* ------------------------------------------------------------ phase C */

#define NC 8
typedef struct {
  KVStoreHandle kv;
  _Atomic int shared_wins[NC];
  long own_pushes[NT][NC];
  long shared_pushes[NT][NC];
} phase_c;

static _Atomic long g_str_calls;
static void str_add_updater(const char *key, NDArrayHandle recv, NDArrayHandle local, void *user) {
  CHECK(tl_pushing);
  CHECK(user == (void *)&g_str_calls);
  CHECK(key != NULL && (key[0] == 't' || key[0] == 's'));
  float r[NEL], l[NEL];
  read_f32(recv, r, NEL);
  read_f32(local, l, NEL);
  for (int i = 0; i < NEL; i++) l[i] += r[i];
  CHECK_OK(MXNDArraySyncCopyFromCPU(local, l, NEL));
  CHECK_OK(MXNDArrayFree(recv));
  CHECK_OK(MXNDArrayFree(local));
  atomic_fetch_add(&g_str_calls, 1);
}
static void int_must_not_run(int key, NDArrayHandle recv, NDArrayHandle local, void *user) {
  (void)key, (void)recv, (void)local, (void)user;
  fprintf(stderr, "the int updater was called on a string-keyed store with a string updater\n");
  exit(1);
}

static void *phase_c_thread(void *arg) {
  targ *a = arg;
  int t = a->t;
  phase_c *p = a->ctx;
  char own[NC][32], shared[NC][32];
  float v[NEL];
  fill(v, NEL, 0);
  NDArrayHandle z = make_f32(NEL, v), out = make_f32(NEL, NULL);
  fill(v, NEL, 1);
  NDArrayHandle one = make_f32(NEL, v);
  start_together();
  for (int j = 0; j < NC; j++) {
    snprintf(own[j], sizeof own[j], "t%d-k%d", t, j);
    snprintf(shared[j], sizeof shared[j], "s-%d", j);
    const char *k1[1] = {own[j]}, *k2[1] = {shared[j]};
    CHECK_OK(MXKVStoreInitEx(p->kv, 1, k1, &z));
    if (MXKVStoreInitEx(p->kv, 1, k2, &z) == 0)
      atomic_fetch_add(&p->shared_wins[j], 1);
    else
      CHECK(strstr(MXGetLastError(), "MXKVStoreInitEx: duplicate init of key s-") != NULL);
  }
  start_together(); /* all keys exist now */
  float last = 0;
  for (int i = 0; i < g_iters; i++) {
    int j = i % NC;
    const char *ks[3] = {own[j], shared[j], own[j]};
    tl_pushing = 1;
    CHECK_OK(MXKVStorePushEx(p->kv, 3, ks, (NDArrayHandle[]){one, one, one}, 0));
    tl_pushing = 0;
    p->own_pushes[t][j] += 2;
    p->shared_pushes[t][j] += 1;
    const char *pk[1] = {own[j]};
    CHECK_OK(MXKVStorePullEx(p->kv, 1, pk, &out, 0));
    float got = check_uniform(out, NULL);
    if (j == 0) {
      CHECK(got >= last);
      last = got;
    }
    const char *nope[1] = {"nope"};
    CHECK_ERR(MXKVStorePullEx(p->kv, 1, nope, &out, 0), "key nope doesn't exist");
  }
  CHECK_OK(MXNDArrayFree(z));
  CHECK_OK(MXNDArrayFree(out));
  CHECK_OK(MXNDArrayFree(one));
  return NULL;
}

static int g_ids_seen[NT * NC + NC], g_nids;
static void id_updater(int key, NDArrayHandle recv, NDArrayHandle local, void *user) {
  (void)user;
  g_ids_seen[g_nids++] = key;
  CHECK_OK(MXNDArrayFree(recv));
  CHECK_OK(MXNDArrayFree(local));
}

static void run_phase_c(void) {
  static phase_c p;
  memset(&p, 0, sizeof p);
  CHECK_OK(MXKVStoreCreate("device", &p.kv));
  atomic_store(&g_str_calls, 0);
  CHECK_OK(MXKVStoreSetUpdaterEx(p.kv, int_must_not_run, str_add_updater, (void *)&g_str_calls));
  run_threads("C (string keys)", phase_c_thread, NT, &p);
  NDArrayHandle out = make_f32(NEL, NULL), one = make_f32(NEL, NULL);
  long calls = 0;
  for (int j = 0; j < NC; j++) {
    CHECK(atomic_load(&p.shared_wins[j]) == 1);
    char name[32];
    long sum = 0;
    for (int t = 0; t < NT; t++) {
      snprintf(name, sizeof name, "t%d-k%d", t, j);
      float want[NEL];
      fill(want, NEL, (float)p.own_pushes[t][j]);
      const char *k[1] = {name};
      CHECK_OK(MXKVStorePullEx(p.kv, 1, k, &out, 0));
      CHECK_F32V(out, NEL, want);
      sum += p.shared_pushes[t][j];
      calls += p.shared_pushes[t][j] * 2; /* two distinct keys per push */
    }
    snprintf(name, sizeof name, "s-%d", j);
    const char *k[1] = {name};
    float want[NEL];
    fill(want, NEL, (float)sum);
    CHECK_OK(MXKVStorePullEx(p.kv, 1, k, &out, 0));
    CHECK_F32V(out, NEL, want);
  }
  CHECK(atomic_load(&g_str_calls) == calls);
  /* the internal ids of the NT*NC + NC names are 0 .. N-1, each once */
  CHECK_OK(MXKVStoreSetUpdaterEx(p.kv, id_updater, NULL, NULL));
  g_nids = 0;
  for (int t = 0; t <= NT; t++) {
    for (int j = 0; j < NC; j++) {
      char name[32];
      if (t < NT)
        snprintf(name, sizeof name, "t%d-k%d", t, j);
      else
        snprintf(name, sizeof name, "s-%d", j);
      const char *k[1] = {name};
      CHECK_OK(MXKVStorePushEx(p.kv, 1, k, &one, 0));
    }
  }
  CHECK(g_nids == NT * NC + NC);
  int seen[NT * NC + NC] = {0};
  for (int i = 0; i < g_nids; i++) {
    CHECK(g_ids_seen[i] >= 0 && g_ids_seen[i] < NT * NC + NC);
    CHECK(seen[g_ids_seen[i]]++ == 0);
  }
  CHECK_OK(MXNDArrayFree(out));
  CHECK_OK(MXNDArrayFree(one));
  CHECK_OK(MXKVStoreFree(p.kv));
}

/* ------------------------------------------------------------ phase D */

static void *phase_d_thread(void *arg) {
  targ *a = arg;
  int t = a->t;
  uint32_t seed = 0x9e3779b9u * (uint32_t)(t + 1);
  char path[64];
  snprintf(path, sizeof path, "/tmp/mxkv_threads_%d_XXXXXX", t);
  int fd = mkstemp(path);
  CHECK(fd >= 0);
  close(fd);
  start_together();
  for (int i = 0; i < g_iters; i++) {
    int dtype = (int)(rnd(&seed) % 13);
    int ndim = 1 + (int)(rnd(&seed) % 3);
    int64_t shape[3] = {1, 1, 1};
    size_t n = 1;
    for (int d = 0; d < ndim; d++) {
      shape[d] = 1 + (int64_t)(rnd(&seed) % 4);
      n *= (size_t)shape[d];
    }
    size_t nbytes = n * dtype_size(dtype);
    unsigned char src[64 * 8], back[64 * 8];
    for (size_t b = 0; b < nbytes; b++) src[b] = (unsigned char)(dtype == DT_BOOL ? 1 : rnd(&seed));
    NDArrayHandle h = NULL, d = NULL, none = NULL;
    if (i % 2)
      CHECK_OK(MXNDArrayCreateEx64(shape, ndim, i % 3 ? DEV_CPU : DEV_CPU_PINNED, t, 0, dtype, &h));
    else
      CHECK_OK(MXNDArrayCreateEx((uint32_t[]){(uint32_t)shape[0], (uint32_t)shape[1], (uint32_t)shape[2]},
                                 (uint32_t)ndim, DEV_CPU, 0, 0, dtype, &h));
    CHECK_OK(MXNDArrayCreateNone(&none));
    CHECK_OK(MXNDArraySyncCopyFromCPU(h, src, n));
    CHECK_OK(MXNDArrayGetDataNDArray(h, &d));
    int gd = -1, gndim = 0;
    const int64_t *gs = NULL;
    CHECK_OK(MXNDArrayGetDType(d, &gd));
    CHECK(gd == dtype);
    CHECK_OK(MXNDArrayGetShapeEx64(d, &gndim, &gs));
    CHECK(gndim == ndim);
    for (int k = 0; k < ndim; k++) CHECK(gs[k] == shape[k]);
    CHECK_OK(MXNDArrayFree(h));
    CHECK_OK(MXNDArraySyncCopyToCPU(d, back, n));
    CHECK(memcmp(src, back, nbytes) == 0);
    if (i % 8 == 0) {
      CHECK_OK(MXNDArraySave(path, 1, &d, (const char *[]){"x"}));
      uint32_t cnt = 0, ncnt = 0;
      NDArrayHandle *arr = NULL;
      const char **names = NULL;
      CHECK_OK(MXNDArrayLoad(path, &cnt, &arr, &ncnt, &names));
      CHECK(cnt == 1 && ncnt == 1 && strcmp(names[0], "x") == 0);
      NDArrayHandle l = arr[0];
      memset(back, 0, sizeof back);
      CHECK_OK(MXNDArraySyncCopyToCPU(l, back, n));
      CHECK(memcmp(src, back, nbytes) == 0);
      CHECK_OK(MXNDArrayFree(l));
    }
    CHECK_OK(MXNDArrayFree(d));
    CHECK_OK(MXNDArrayFree(none));
  }
  unlink(path);
  return NULL;
}

/* ------------------------------------------------------------ phase E */

#define NSLOTS 12
typedef struct {
  KVStoreHandle kv;
  _Atomic(NDArrayHandle) slots[NSLOTS];
  _Atomic long ok, stale, frees, lost_races;
} phase_e;

static void expect_ok_or_stale(phase_e *p, int rc, const char *what) {
  if (rc == 0) {
    atomic_fetch_add(&p->ok, 1);
    return;
  }
  const char *m = MXGetLastError();
  if (rc != -1 || strstr(m, "is stale (already freed?)") == NULL) {
    fprintf(stderr, "phase E: %s returned %d: %s\n", what, rc, m);
    exit(1);
  }
  atomic_fetch_add(&p->stale, 1);
}

static void *phase_e_thread(void *arg) {
  targ *a = arg;
  int t = a->t;
  phase_e *p = a->ctx;
  uint32_t seed = 0x1234567u + (uint32_t)t * 7919u;
  float mine[4] = {(float)t, (float)t, (float)t, (float)t}, buf[4];
  int key = 0;
  start_together();
  for (int i = 0; i < g_iters * 2; i++) {
    int s = (int)(rnd(&seed) % NSLOTS);
    NDArrayHandle h = atomic_load(&p->slots[s]);
    if (t < 2) {
      /* freers (two of them race on the same handles) */
      int rc = MXNDArrayFree(h);
      if (rc == 0) {
        atomic_fetch_add(&p->frees, 1);
        NDArrayHandle fresh = make_f32(4, mine);
        NDArrayHandle expected = h;
        CHECK(atomic_compare_exchange_strong(&p->slots[s], &expected, fresh));
      } else {
        CHECK(strstr(MXGetLastError(), "MXNDArrayFree: handle (NDArrayHandle) is stale") != NULL);
        atomic_fetch_add(&p->lost_races, 1);
      }
      continue;
    }
    /* users: whatever they hold may be freed under them */
    NDArrayHandle h2 = atomic_load(&p->slots[(s + 1) % NSLOTS]);
    switch (rnd(&seed) % 10) {
      case 0:
        expect_ok_or_stale(p, MXNDArraySyncCopyFromCPU(h, mine, 4), "SyncCopyFromCPU");
        break;
      case 1: {
        int rc = MXNDArraySyncCopyToCPU(h, buf, 4);
        expect_ok_or_stale(p, rc, "SyncCopyToCPU");
        if (rc == 0) CHECK(buf[0] == buf[1] && buf[1] == buf[2] && buf[2] == buf[3]);
        break;
      }
      case 2: {
        int ndim = 0;
        const int *dims = NULL;
        int rc = MXNDArrayGetShapeEx(h, &ndim, &dims);
        expect_ok_or_stale(p, rc, "GetShapeEx");
        if (rc == 0) CHECK(ndim == 1 && dims[0] == 4);
        break;
      }
      case 3:
        expect_ok_or_stale(p, MXKVStorePush(p->kv, 2, (int[]){0, 0}, (NDArrayHandle[]){h, h2}, 0), "Push");
        break;
      case 4: {
        int rc = MXKVStorePull(p->kv, 1, &key, &h, 0);
        expect_ok_or_stale(p, rc, "Pull");
        break;
      }
      case 5:
        expect_ok_or_stale(p, MXKVStorePushPull(p->kv, 1, &key, 1, &key, &h, &h2, 0), "PushPull");
        break;
      case 6: {
        NDArrayHandle d = NULL;
        int rc = MXNDArrayGetDataNDArray(h, &d);
        expect_ok_or_stale(p, rc, "GetDataNDArray");
        if (rc == 0) {
          /* the shared view outlives a free of the original */
          CHECK_OK(MXNDArraySyncCopyToCPU(d, buf, 4));
          CHECK(buf[0] == buf[3]);
          CHECK_OK(MXNDArrayFree(d));
        }
        break;
      }
      case 7:
        expect_ok_or_stale(p, MXNDArraySyncCopyFromNDArray(h, h2, -1), "SyncCopyFromNDArray");
        break;
      case 8: {
        int dt = -1;
        expect_ok_or_stale(p, MXNDArrayGetDType(h, &dt), "GetDType");
        break;
      }
      case 9:
        expect_ok_or_stale(p, MXNDArrayWaitToRead(h), "WaitToRead");
        break;
    }
  }
  return NULL;
}

static void run_phase_e(void) {
  static phase_e p;
  memset(&p, 0, sizeof p);
  CHECK_OK(MXKVStoreCreate("local", &p.kv));
  NDArrayHandle z = make_f32(4, NULL);
  int key = 0;
  CHECK_OK(MXKVStoreInit(p.kv, 1, &key, &z));
  for (int s = 0; s < NSLOTS; s++) atomic_store(&p.slots[s], make_f32(4, NULL));
  run_threads("E (free while in use)", phase_e_thread, NT, &p);
  CHECK(atomic_load(&p.frees) > 0);
  for (int s = 0; s < NSLOTS; s++) CHECK_OK(MXNDArrayFree(atomic_load(&p.slots[s])));
  CHECK_OK(MXKVStorePull(p.kv, 1, &key, &z, 0));
  float v[4];
  read_f32(z, v, 4);
  CHECK(v[0] == v[1] && v[1] == v[2] && v[2] == v[3]);
  CHECK_OK(MXNDArrayFree(z));
  CHECK_OK(MXKVStoreFree(p.kv));
  if (check_verbose())
    fprintf(stderr, "  phase E: %ld ok, %ld stale, %ld frees, %ld lost free races\n", atomic_load(&p.ok),
            atomic_load(&p.stale), atomic_load(&p.frees), atomic_load(&p.lost_races));
}

/* ------------------------------------------------------------ phase F */

typedef struct {
  KVStoreHandle kv;
  _Atomic long ops;
  _Atomic int freed;
} phase_f;

static void *phase_f_thread(void *arg) {
  targ *a = arg;
  int t = a->t;
  phase_f *p = a->ctx;
  float v[NEL];
  fill(v, NEL, 1);
  NDArrayHandle one = make_f32(NEL, v), out = make_f32(NEL, NULL);
  start_together();
  if (t == 0) {
    /* wait for some traffic, then free the store under the others. Sleep,
       not sched_yield: under valgrind's default (unfair) scheduler lock a
       yielding spinner can keep the lock and starve the pushers. */
    for (long naps = 0; atomic_load(&p->ops) < 20L * (NT - 1); naps++) {
      CHECK(naps < 10L * 1000 * g_timeout); /* the watchdog fires first */
      nanosleep(&(struct timespec){0, 100000}, NULL);
    }
    atomic_store(&p->freed, 1); /* before: a thread may see the stale handle at once */
    CHECK_OK(MXKVStoreFree(p->kv));
  } else {
    int stale_seen = 0;
    for (long i = 0; stale_seen < 5; i++) {
      CHECK(i < 100000000L);
      int k = (int)(i % 2), rc;
      const char *type = NULL;
      tl_pushing = 1;
      switch (i % 4) {
        case 0: rc = MXKVStorePush(p->kv, 2, (int[]){k, k}, (NDArrayHandle[]){one, one}, 0); break;
        case 1: rc = MXKVStorePull(p->kv, 1, &k, &out, 0); break;
        case 2: rc = MXKVStorePushPull(p->kv, 1, &k, 1, &k, &one, &out, 0); break;
        default: rc = MXKVStoreGetType(p->kv, &type); break; /* the string is not read: it dies with the store */
      }
      tl_pushing = 0;
      if (rc == 0) {
        CHECK(stale_seen == 0); /* once stale, stale for good */
        atomic_fetch_add(&p->ops, 1);
        if (i % 4 == 1 || i % 4 == 2) check_uniform(out, NULL);
      } else {
        CHECK(rc == -1 && strstr(MXGetLastError(), "KVStoreHandle is stale") != NULL);
        CHECK(atomic_load(&p->freed));
        stale_seen++;
      }
    }
  }
  CHECK_OK(MXNDArrayFree(one));
  CHECK_OK(MXNDArrayFree(out));
  return NULL;
}

static void run_phase_f(void) {
  static phase_f p;
  memset(&p, 0, sizeof p);
  CHECK_OK(MXKVStoreCreate("local", &p.kv));
  NDArrayHandle z = make_f32(NEL, NULL);
  CHECK_OK(MXKVStoreInit(p.kv, 2, (int[]){0, 1}, (NDArrayHandle[]){z, z}));
  CHECK_OK(MXKVStoreSetUpdater(p.kv, add_updater, (void *)&g_add_calls));
  CHECK_OK(MXNDArrayFree(z));
  run_threads("F (store freed while in use)", phase_f_thread, NT, &p);
}

/* ------------------------------------------------------------ phase G */

/* Updaters that read (and optionally push to) the *other* key while another
   thread updates that key. G1 forces the interleaving once: threads 0 and 1
   meet at a barrier inside their first update (each is inside the update of
   its own key), then each pulls the other key. Then all threads push at
   random. With MXKV_TEST_CROSS_PUSH=1 the updaters also push to the other key
   (a cycle: each update waits for the other key's update). */
static KVStoreHandle g_cross_kv;
static bool g_cross_push;
static pthread_barrier_t g_inside; /* threads 0 and 1, inside their updates */
static _Thread_local int tl_depth, tl_meet;
static void cross_updater(int key, NDArrayHandle recv, NDArrayHandle local, void *user) {
  (void)user;
  CHECK(key == 0 || key == 1);
  int other = 1 - key;
  if (tl_meet) {
    tl_meet = 0;
    int rc = pthread_barrier_wait(&g_inside);
    CHECK(rc == 0 || rc == PTHREAD_BARRIER_SERIAL_THREAD);
  }
  if (tl_depth == 0) {
    tl_depth = 1;
    NDArrayHandle peek = make_f32(NEL, NULL);
    CHECK_OK(MXKVStorePull(g_cross_kv, 1, &other, &peek, 0));
    check_uniform(peek, NULL);
    if (g_cross_push) CHECK_OK(MXKVStorePush(g_cross_kv, 1, &other, &recv, 0));
    CHECK_OK(MXNDArrayFree(peek));
    tl_depth = 0;
  }
  float r[NEL], l[NEL];
  read_f32(recv, r, NEL);
  read_f32(local, l, NEL);
  for (int i = 0; i < NEL; i++) l[i] += r[i];
  CHECK_OK(MXNDArraySyncCopyFromCPU(local, l, NEL));
  CHECK_OK(MXNDArrayFree(recv));
  CHECK_OK(MXNDArrayFree(local));
}

static void *phase_g_thread(void *arg) {
  targ *a = arg;
  int key = a->t % 2;
  float v[NEL];
  fill(v, NEL, 1);
  NDArrayHandle one = make_f32(NEL, v);
  if (a->t < 2) { /* G1: both inside their own update, then each pulls the other key */
    tl_meet = 1;
    CHECK_OK(MXKVStorePush(g_cross_kv, 1, &key, &one, 0));
  }
  start_together();
  for (int i = 0; i < g_iters; i++) CHECK_OK(MXKVStorePush(g_cross_kv, 1, &key, &one, 0));
  CHECK_OK(MXNDArrayFree(one));
  return NULL;
}

static void run_phase_g(void) {
  const char *e = getenv("MXKV_TEST_CROSS_PUSH");
  g_cross_push = e != NULL && e[0] == '1';
  CHECK_OK(MXKVStoreCreate("local", &g_cross_kv));
  NDArrayHandle z = make_f32(NEL, NULL);
  CHECK_OK(MXKVStoreInit(g_cross_kv, 2, (int[]){0, 1}, (NDArrayHandle[]){z, z}));
  CHECK_OK(MXKVStoreSetUpdater(g_cross_kv, cross_updater, NULL));
  CHECK(pthread_barrier_init(&g_inside, NULL, 2) == 0);
  run_threads("G (updaters reading other keys)", phase_g_thread, NT, NULL);
  CHECK(pthread_barrier_destroy(&g_inside) == 0);
  /* each push of one adds 1 to its key (and, with cross pushes, 1 to the other) */
  long per_key = (long)(NT / 2) * g_iters + 1;
  if (g_cross_push) per_key *= 2;
  float want[NEL];
  fill(want, NEL, (float)per_key);
  for (int k = 0; k < 2; k++) {
    CHECK_OK(MXKVStorePull(g_cross_kv, 1, &k, &z, 0));
    CHECK_F32V(z, NEL, want);
  }
  CHECK_OK(MXNDArrayFree(z));
  CHECK_OK(MXKVStoreFree(g_cross_kv));
}

/* ------------------------------------------------------------ phase H */

/* row_sparse values the store adopts without a copy while their owners
   rewrite them: every thread pushes fresh values of its own (rows t and
   t + NT, every element i + 1) to one key, at once overwrites each through a
   data handle with -1 (and frees every other one), and pulls the key: what it
   reads is always one whole pushed value, never -1, never torn. */
#define H_COLS 16
#define H_ROWS (2 * NT)
static KVStoreHandle g_h_kv;

static void check_h_value(NDArrayHandle dense) {
  float v[H_ROWS * H_COLS];
  read_f32(dense, v, H_ROWS * H_COLS);
  int first = -1;
  for (int r = 0; r < H_ROWS; r++) {
    float x = v[r * H_COLS];
    for (int c = 0; c < H_COLS; c++) CHECK(v[r * H_COLS + c] == x); /* rows whole */
    CHECK(x >= 0);                                                    /* never poisoned */
    if (x > 0 && first < 0) first = r;
  }
  if (first < 0) return; /* nothing pushed yet */
  CHECK(first < NT);
  for (int r = 0; r < H_ROWS; r++) {
    float want = (r == first || r == first + NT) ? v[first * H_COLS] : 0;
    CHECK(v[r * H_COLS] == want); /* the two rows of one value, nothing else */
  }
}

static void *phase_h_thread(void *arg) {
  targ *a = arg;
  int t = a->t, key = 0;
  const int64_t ids[2] = {t, t + NT};
  uint32_t shape[2] = {H_ROWS, H_COLS};
  NDArrayHandle dense = make_f32_shape(shape, 2, NULL);
  float v[2 * H_COLS], poison[2 * H_COLS];
  fill(poison, 2 * H_COLS, -1);
  start_together();
  for (int i = 0; i < g_iters; i++) {
    fill(v, 2 * H_COLS, (float)(i + 1));
    NDArrayHandle val = make_rsp(H_ROWS, H_COLS, ids, 2, v), d = NULL;
    CHECK_OK(MXKVStorePush(g_h_kv, 1, &key, &val, 0));
    CHECK_OK(MXNDArrayGetDataNDArray(val, &d));
    CHECK_OK(MXNDArraySyncCopyFromCPU(d, poison, 2 * H_COLS));
    CHECK_OK(MXNDArrayFree(d));
    if (i % 2) CHECK_OK(MXNDArrayFree(val));
    CHECK_OK(MXKVStorePull(g_h_kv, 1, &key, &dense, 0));
    check_h_value(dense);
    if (!(i % 2)) CHECK_OK(MXNDArrayFree(val));
  }
  CHECK_OK(MXNDArrayFree(dense));
  return NULL;
}

static void run_phase_h(void) {
  CHECK_OK(MXKVStoreCreate("local", &g_h_kv));
  NDArrayHandle empty = make_rsp(H_ROWS, H_COLS, NULL, 0, NULL);
  int key = 0;
  CHECK_OK(MXKVStoreInit(g_h_kv, 1, &key, &empty));
  run_threads("H (row_sparse values adopted while rewritten)", phase_h_thread, NT, NULL);
  uint32_t shape[2] = {H_ROWS, H_COLS};
  NDArrayHandle dense = make_f32_shape(shape, 2, NULL);
  CHECK_OK(MXKVStorePull(g_h_kv, 1, &key, &dense, 0));
  check_h_value(dense);
  float v[H_ROWS * H_COLS];
  read_f32(dense, v, H_ROWS * H_COLS);
  float last = 0;
  for (int r = 0; r < H_ROWS; r++) last = v[r * H_COLS] > last ? v[r * H_COLS] : last;
  CHECK(last == (float)g_iters); /* the last push of some thread */
  CHECK_OK(MXNDArrayFree(dense));
  CHECK_OK(MXNDArrayFree(empty));
  CHECK_OK(MXKVStoreFree(g_h_kv));
}

/* ------------------------------------------------------------- phase I */

/* No call waits on a lock its own thread holds. Every thread, on its own key
   of one row_sparse store (all rows stored, so the data part has the key's
   shape): copies a row_sparse array into a handle on that array's own data
   part (MXNet 1.9.1: rc 0, the values unchanged), and pushes through an
   updater that first pulls the key into local's data part and then assigns
   recv. Each of these used to wait forever on its own lock (and every later
   push of the key with it). */
#define I_ROWS 2
#define I_COLS 4
static KVStoreHandle g_i_kv;
static _Thread_local float tl_i_last; /* the value this thread last stored */

static void i_values(float *v, float x) {
  for (int i = 0; i < I_ROWS * I_COLS; i++) v[i] = x + (float)i;
}

static void i_updater(int key, NDArrayHandle recv, NDArrayHandle local, void *user) {
  (void)user;
  NDArrayHandle d = NULL, rd = NULL, ra = NULL;
  float got[I_ROWS * I_COLS], want[I_ROWS * I_COLS];
  CHECK_OK(MXNDArrayGetDataNDArray(local, &d));
  CHECK_OK(MXKVStorePull(g_i_kv, 1, &key, &d, 0)); /* the key into local's own data */
  read_f32(d, got, I_ROWS * I_COLS);
  i_values(want, tl_i_last);
  CHECK(memcmp(got, want, sizeof got) == 0);
  CHECK_OK(MXNDArrayGetDataNDArray(recv, &rd));
  CHECK_OK(MXNDArrayGetAuxNDArray(recv, 0, &ra));
  CHECK_OK(MXNDArraySyncCopyFromNDArray(local, rd, -1));
  CHECK_OK(MXNDArraySyncCopyFromNDArray(local, ra, 0));
  NDArrayHandle hs[5] = {d, rd, ra, recv, local};
  for (int i = 0; i < 5; i++) CHECK_OK(MXNDArrayFree(hs[i]));
}

static void *phase_i_thread(void *arg) {
  targ *a = arg;
  int key = a->t;
  const int64_t ids[I_ROWS] = {0, 1};
  uint32_t shape[2] = {I_ROWS, I_COLS};
  NDArrayHandle dense = make_f32_shape(shape, 2, NULL);
  float v[I_ROWS * I_COLS], got[I_ROWS * I_COLS];
  tl_i_last = (float)(100 * key);
  start_together();
  int iters = g_iters / 4 > 0 ? g_iters / 4 : 1;
  for (int i = 0; i < iters; i++) {
    float x = (float)(100 * key + i + 1);
    i_values(v, x);
    NDArrayHandle r = make_rsp(I_ROWS, I_COLS, ids, I_ROWS, v), d = NULL;
    /* an array into its own data part */
    CHECK_OK(MXNDArrayGetDataNDArray(r, &d));
    CHECK_OK(MXNDArraySyncCopyFromNDArray(d, r, -1));
    read_f32(d, got, I_ROWS * I_COLS);
    CHECK(memcmp(got, v, sizeof got) == 0);
    CHECK_OK(MXNDArrayFree(d));
    /* a push whose updater pulls the key into local's data part */
    CHECK_OK(MXKVStorePush(g_i_kv, 1, &key, &r, 0));
    tl_i_last = x;
    CHECK_OK(MXKVStorePull(g_i_kv, 1, &key, &dense, 0));
    read_f32(dense, got, I_ROWS * I_COLS);
    CHECK(memcmp(got, v, sizeof got) == 0);
    CHECK_OK(MXNDArrayFree(r));
  }
  CHECK_OK(MXNDArrayFree(dense));
  return NULL;
}

static void run_phase_i_on(const char *type) {
  CHECK_OK(MXKVStoreCreate(type, &g_i_kv));
  const int64_t ids[I_ROWS] = {0, 1};
  float v[I_ROWS * I_COLS];
  for (int t = 0; t < NT; t++) {
    i_values(v, (float)(100 * t));
    NDArrayHandle r = make_rsp(I_ROWS, I_COLS, ids, I_ROWS, v);
    CHECK_OK(MXKVStoreInit(g_i_kv, 1, &t, &r));
    CHECK_OK(MXNDArrayFree(r));
  }
  CHECK_OK(MXKVStoreSetUpdater(g_i_kv, i_updater, NULL));
  run_threads("I (no call waits on a lock its own thread holds)", phase_i_thread, NT, NULL);
  CHECK_OK(MXKVStoreFree(g_i_kv));
}

static void run_phase_i(void) {
  run_phase_i_on("local");
  run_phase_i_on("device");
}

/* ------------------------------------------------------------------ main */

int main(void) {
  const char *e = getenv("MXKV_TEST_ITERS");
  if (e && atoi(e) > 0) g_iters = atoi(e);
  e = getenv("MXKV_TEST_TIMEOUT");
  if (e && atoi(e) > 0) g_timeout = atoi(e);
  live_t start = live_now();

  static const struct {
    const char *name;
    void (*run)(void);
  } phases[] = {
      {"C", run_phase_c}, {"E", run_phase_e}, {"F", run_phase_f},
      {"B", run_phase_b_both}, {"G", run_phase_g}, {"H", run_phase_h},
      {"I", run_phase_i},
  };
  const char *only = getenv("MXKV_TEST_PHASES"); /* e.g. "ABD" */

  if (!only || strchr(only, 'A')) {
    run_phase_a("local");
    CHECK_LIVE(start);
    run_phase_a("device");
    CHECK_LIVE(start);
  }
  if (!only || strchr(only, 'D')) {
    run_threads("D (array churn)", phase_d_thread, NT, NULL);
    CHECK_LIVE(start);
  }
  for (size_t i = 0; i < sizeof phases / sizeof phases[0]; i++) {
    if (only && !strchr(only, phases[i].name[0])) continue;
    phases[i].run();
    CHECK_LIVE(start);
  }
  printf("test_threads: OK\n");
  return 0;
}

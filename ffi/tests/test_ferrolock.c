/* C tests of libferrolock against real redis-servers (started by tests/with-redis.sh).
 * Usage: test_ferrolock [--only name,name... | --except name,name...] | test_ferrolock hold KEY MS (a contender).
 * The last line says how many passed and failed. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ferrolock.h"

static char failure[1024];
static int check_failed;

#define CHECK(cond, ...)                                                              \
  do {                                                                                \
    if (!(cond)) {                                                                    \
      snprintf(failure, sizeof failure, "%s:%d: %s: ", __FILE__, __LINE__, #cond);    \
      size_t used = strlen(failure);                                                  \
      snprintf(failure + used, sizeof failure - used, " " __VA_ARGS__);              \
      check_failed = 1;                                                               \
      return;                                                                         \
    }                                                                                 \
  } while (0)


static ferrolock_error *err;

static int expect(int got, int want, const char *needle, const char *what, int line) {
  int ok = got == want;
  if (ok && want != FERROLOCK_OK && want != FERROLOCK_PENDING) {
    ok = err != NULL && err->code == want && err->message != NULL && err->message[0] != '\0' &&
         (needle == NULL || strstr(err->message, needle) != NULL);
  }
  if (!ok) {
    snprintf(failure, sizeof failure, "line %d: %s: got %s (%d) want %s; message: %s", line, what,
             ferrolock_status_name(got), got, ferrolock_status_name(want),
             err && err->message ? err->message : "(none)");
  } else if (want != FERROLOCK_OK && want != FERROLOCK_PENDING && getenv("FERROLOCK_TEST_VERBOSE")) {
    fprintf(stderr, "    %s -> %s: %s\n", what, ferrolock_status_name(got), err->message);
  }
  ferrolock_error_free(err);
  err = NULL;
  return ok;
}

#define EXPECT(call_expr, want, needle)                                    \
  do {                                                                     \
    if (!expect((call_expr), (want), (needle), #call_expr, __LINE__)) {    \
      check_failed = 1;                                                    \
      return;                                                              \
    }                                                                      \
  } while (0)

static double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static void sleep_ms(int ms) {
  struct timespec t = {ms / 1000, (long)(ms % 1000) * 1000000L};
  while (nanosleep(&t, &t) != 0 && errno == EINTR) {
  }
}

static char key_buf[128];
static const char *fresh_key(const char *name) {
  static int n;
  snprintf(key_buf, sizeof key_buf, "ffi-test:%d:%s:%d", (int)getpid(), name, n++);
  return key_buf;
}

static int node_ports[8], node_pids[8], node_count;

static void read_nodes(void) {
  const char *ports = getenv("FERROLOCK_TEST_PORTS"), *pids = getenv("FERROLOCK_TEST_PIDS");
  if (!ports || !pids) {
    fprintf(stderr, "run through tests/with-redis.sh (FERROLOCK_TEST_PORTS is not set)\n");
    exit(2);
  }
  char *end;
  for (node_count = 0; *ports && node_count < 8; node_count++) {
    node_ports[node_count] = (int)strtol(ports, &end, 10);
    ports = *end ? end + 1 : end;
    node_pids[node_count] = (int)strtol(pids, &end, 10);
    pids = *end ? end + 1 : end;
  }
}

/* Options over every test node, plus the given ms settings (name, value, ..., NULL). */
static ferrolock_options *options_ms(const char *name, ...) {
  ferrolock_options *o = ferrolock_options_new();
  if (ferrolock_options_set_str(o, "nodes", getenv("FERROLOCK_NODES"), NULL) != FERROLOCK_OK)
    abort();
  /* The servers were started a moment ago: their votes count at once. */
  if (ferrolock_options_set_ms(o, "restart_guard", 0, NULL) != FERROLOCK_OK) abort();
  /* Under valgrind every request is many times slower than the 200 ms default allows. */
  const char *slow = getenv("FERROLOCK_TEST_NODE_TIMEOUT_MS");
  if (slow && ferrolock_options_set_ms(o, "node_timeout", strtoull(slow, NULL, 10), NULL) != FERROLOCK_OK)
    abort();
  /* A ttl that node timeout fits (its loss margin, 2 × node timeout, under ttl/3). */
  if (slow && ferrolock_options_set_ms(o, "ttl", 10 * strtoull(slow, NULL, 10), NULL) != FERROLOCK_OK)
    abort();
  va_list ap;
  va_start(ap, name);
  for (; name; name = va_arg(ap, const char *)) {
    uint64_t v = va_arg(ap, uint64_t);
    if (ferrolock_options_set_ms(o, name, v, NULL) != FERROLOCK_OK) abort();
  }
  va_end(ap);
  return o;
}

static ferrolock_manager *manager_with(ferrolock_options *o) {
  ferrolock_manager *m = NULL;
  if (ferrolock_manager_new(o, &m, NULL) != FERROLOCK_OK) abort();
  ferrolock_options_free(o);
  return m;
}

/* Keys on node i whose name contains `part` (redis-cli --scan), request latches left out: a
 * release leaves one for its short PX (twice the node timeout) so that a re-sent release
 * answers as the first did (DESIGN.md, "Requests that may run twice"). */
static long keys_on(int i, const char *part) {
  char cmd[320];
  snprintf(cmd, sizeof cmd, "redis-cli -p %d --scan --pattern '*%s*' | grep -v '^ferrolock:latch:' | wc -l",
           node_ports[i], part);
  FILE *p = popen(cmd, "r");
  long n = -1;
  if (p) {
    if (fscanf(p, "%ld", &n) != 1) n = -1;
    pclose(p);
  }
  return n;
}

static void pause_majority(int on) {
  for (int i = node_count - (node_count / 2 + 1); i < node_count; i++)
    kill(node_pids[i], on ? SIGSTOP : SIGCONT);
}

/* ---- tests ---- */

static void test_acquire_release(void) {
  ferrolock_options *o = options_ms("ttl", (uint64_t)30000, NULL);
  EXPECT(ferrolock_options_set_bool(o, "fencing", true, &err), FERROLOCK_OK, NULL);
  ferrolock_manager *m = manager_with(o);
  const char *key = fresh_key("basic");
  ferrolock_lock *lock = NULL;
  EXPECT(ferrolock_manager_acquire(m, key, NULL, NULL, &lock, &err), FERROLOCK_OK, NULL);
  CHECK(lock != NULL);
  CHECK(strcmp(ferrolock_lock_key(lock), key) == 0);
  CHECK(strlen(ferrolock_lock_token(lock)) >= 32, "token %s", ferrolock_lock_token(lock));
  uint64_t v = ferrolock_lock_validity_ms(lock);
  CHECK(v > 0 && v <= 30000, "validity %llu", (unsigned long long)v);
  CHECK(ferrolock_lock_is_held(lock) && !ferrolock_lock_is_lost(lock));
  EXPECT(ferrolock_lock_check(lock, &err), FERROLOCK_OK, NULL);
  uint64_t fence1 = 0;
  EXPECT(ferrolock_lock_fence(lock, &fence1, &err), FERROLOCK_OK, NULL);
  CHECK(fence1 > 0);
  bool released = false;
  EXPECT(ferrolock_lock_release(lock, &released, &err), FERROLOCK_OK, NULL);
  CHECK(released);
  CHECK(!ferrolock_lock_is_held(lock) && ferrolock_lock_validity_ms(lock) == 0);
  EXPECT(ferrolock_lock_release(lock, &released, &err), FERROLOCK_ERR_NOT_HELD, "already released");
  ferrolock_lock_free(lock);
  /* The next grant's fence is greater. */
  EXPECT(ferrolock_manager_try_acquire(m, key, NULL, &lock, &err), FERROLOCK_OK, NULL);
  uint64_t fence2 = 0;
  EXPECT(ferrolock_lock_fence(lock, &fence2, &err), FERROLOCK_OK, NULL);
  CHECK(fence2 > fence1, "%llu then %llu", (unsigned long long)fence1, (unsigned long long)fence2);
  EXPECT(ferrolock_lock_release(lock, NULL, &err), FERROLOCK_OK, NULL);
  ferrolock_lock_free(lock);
  ferrolock_manager_free(m);
}

static void test_exclusion_and_reentry(void) {
  ferrolock_manager *a = manager_with(options_ms(NULL)), *b = manager_with(options_ms(NULL));
  const char *key = fresh_key("exclusive");
  ferrolock_lock *held = NULL, *other = NULL;
  EXPECT(ferrolock_manager_acquire(a, key, NULL, NULL, &held, &err), FERROLOCK_OK, NULL);
  EXPECT(ferrolock_manager_try_acquire(b, key, NULL, &other, &err), FERROLOCK_ERR_NOT_ACQUIRED, key);
  CHECK(other == NULL);
  ferrolock_options *wait = ferrolock_options_new();
  EXPECT(ferrolock_options_set_ms(wait, "wait", 200, &err), FERROLOCK_OK, NULL);
  EXPECT(ferrolock_manager_acquire(b, key, wait, NULL, &other, &err), FERROLOCK_ERR_NOT_ACQUIRED, key);
  ferrolock_options_free(wait);
  EXPECT(ferrolock_lock_release(held, NULL, &err), FERROLOCK_OK, NULL);
  ferrolock_lock_free(held);

  /* Reentrant: the same owner re-enters; another manager is kept out until the last release. */
  const char *rkey = fresh_key("reentrant");
  ferrolock_options *re = ferrolock_options_new();
  EXPECT(ferrolock_options_set_bool(re, "reentrant", true, &err), FERROLOCK_OK, NULL);
  ferrolock_lock *outer = NULL, *inner = NULL;
  EXPECT(ferrolock_manager_acquire_owned(a, rkey, 7, re, NULL, &outer, &err), FERROLOCK_OK, NULL);
  EXPECT(ferrolock_manager_acquire_owned(a, rkey, 7, re, NULL, &inner, &err), FERROLOCK_OK, NULL);
  CHECK(strcmp(ferrolock_lock_token(outer), ferrolock_lock_token(inner)) == 0);
  EXPECT(ferrolock_lock_release(inner, NULL, &err), FERROLOCK_OK, NULL);
  EXPECT(ferrolock_manager_try_acquire(b, rkey, re, &other, &err), FERROLOCK_ERR_NOT_ACQUIRED, NULL);
  EXPECT(ferrolock_lock_release(outer, NULL, &err), FERROLOCK_OK, NULL);
  EXPECT(ferrolock_manager_try_acquire(b, rkey, re, &other, &err), FERROLOCK_OK, NULL);
  EXPECT(ferrolock_lock_release(other, NULL, &err), FERROLOCK_OK, NULL);
  ferrolock_lock_free(other);
  ferrolock_lock_free(inner);
  ferrolock_lock_free(outer);
  ferrolock_options_free(re);
  ferrolock_manager_free(a);
  ferrolock_manager_free(b);
}

/* Read-write lock: readers share, a writer is alone, upgrade and a long read ttl refused. */
static void test_read_write(void) {
  ferrolock_manager *a = manager_with(options_ms(NULL)), *b = manager_with(options_ms(NULL));
  const char *key = fresh_key("rw");
  ferrolock_lock *r1 = NULL, *r2 = NULL, *w = NULL;
  EXPECT(ferrolock_manager_read_acquire(a, key, NULL, NULL, &r1, &err), FERROLOCK_OK, NULL);
  EXPECT(ferrolock_manager_rw_try_acquire(b, key, FERROLOCK_RW_READ, NULL, &r2, &err), FERROLOCK_OK, NULL);
  CHECK(ferrolock_lock_is_held(r1) && ferrolock_lock_is_held(r2));
  EXPECT(ferrolock_manager_rw_try_acquire(b, key, FERROLOCK_RW_WRITE, NULL, &w, &err),
         FERROLOCK_ERR_NOT_ACQUIRED, key);
  CHECK(w == NULL);
  EXPECT(ferrolock_lock_release(r1, NULL, &err), FERROLOCK_OK, NULL);
  EXPECT(ferrolock_manager_rw_try_acquire(b, key, FERROLOCK_RW_WRITE, NULL, &w, &err),
         FERROLOCK_ERR_NOT_ACQUIRED, key);
  EXPECT(ferrolock_lock_release(r2, NULL, &err), FERROLOCK_OK, NULL);
  ferrolock_lock_free(r1);
  ferrolock_lock_free(r2);
  /* A writer keeps readers and other writers out. */
  EXPECT(ferrolock_manager_write_acquire(a, key, NULL, NULL, &w, &err), FERROLOCK_OK, NULL);
  EXPECT(ferrolock_manager_rw_try_acquire(b, key, FERROLOCK_RW_READ, NULL, &r1, &err),
         FERROLOCK_ERR_NOT_ACQUIRED, key);
  EXPECT(ferrolock_manager_rw_try_acquire(b, key, FERROLOCK_RW_WRITE, NULL, &r1, &err),
         FERROLOCK_ERR_NOT_ACQUIRED, key);
  CHECK(r1 == NULL);
  EXPECT(ferrolock_lock_release(w, NULL, &err), FERROLOCK_OK, NULL);
  ferrolock_lock_free(w);

  /* An owner holding only the read side is refused the write side. */
  ferrolock_options *once = ferrolock_options_new();
  EXPECT(ferrolock_options_set_ms(once, "wait", 0, &err), FERROLOCK_OK, NULL);
  EXPECT(ferrolock_manager_rw_acquire(a, key, FERROLOCK_RW_READ, 7, NULL, NULL, &r1, &err),
         FERROLOCK_OK, NULL);
  EXPECT(ferrolock_manager_rw_acquire(a, key, FERROLOCK_RW_WRITE, 7, once, NULL, &w, &err),
         FERROLOCK_ERR_INVALID_ARGUMENT, "read->write upgrade is refused");
  CHECK(w == NULL);
  EXPECT(ferrolock_lock_release(r1, NULL, &err), FERROLOCK_OK, NULL);
  ferrolock_lock_free(r1);
  ferrolock_options_free(once);

  /* Bad input: a read ttl above 30 s, a NULL key, a side that is neither. */
  ferrolock_options *long_ttl = ferrolock_options_new();
  EXPECT(ferrolock_options_set_ms(long_ttl, "ttl", 31000, &err), FERROLOCK_OK, NULL);
  EXPECT(ferrolock_manager_read_acquire(a, key, long_ttl, NULL, &r1, &err),
         FERROLOCK_ERR_INVALID_ARGUMENT, "31s");
  CHECK(r1 == NULL);
  ferrolock_options_free(long_ttl);
  EXPECT(ferrolock_manager_read_acquire(a, NULL, NULL, NULL, &r1, &err),
         FERROLOCK_ERR_INVALID_ARGUMENT, "key");
  EXPECT(ferrolock_manager_write_acquire(a, NULL, NULL, NULL, &r1, &err),
         FERROLOCK_ERR_INVALID_ARGUMENT, "key");
  EXPECT(ferrolock_manager_rw_try_acquire(a, key, 3, NULL, &r1, &err),
         FERROLOCK_ERR_INVALID_ARGUMENT, "side 3");
  /* A binding's first try takes a plain lock (0) and a semaphore too: its refusal names them. */
  EXPECT(ferrolock_manager_first_try(a, key, 7, 0, 0, NULL, &r1, &err),
         FERROLOCK_ERR_INVALID_ARGUMENT, "FERROLOCK_SEMAPHORE (3)");
  CHECK(r1 == NULL);
  ferrolock_manager_free(a);
  ferrolock_manager_free(b);
}

/* Options on the first test node only: a semaphore lives on one node. */
static ferrolock_options *one_node(ferrolock_options *o) {
  char url[64];
  snprintf(url, sizeof url, "redis://127.0.0.1:%d", node_ports[0]);
  if (ferrolock_options_set_str(o, "nodes", url, NULL) != FERROLOCK_OK) abort();
  return o;
}

#define SEM_THREADS 6
#define SEM_PERMITS 2
typedef struct {
  ferrolock_manager *m;
  const char *name;
  pthread_mutex_t mu;
  int inside, most, grants, errors;
} sem_run_t;

static void *sem_worker(void *arg) {
  sem_run_t *r = arg;
  for (int i = 0; i < 3; i++) {
    ferrolock_lock *lock = NULL;
    ferrolock_error *e = NULL;
    if (ferrolock_manager_semaphore_acquire(r->m, r->name, SEM_PERMITS, 1, NULL, NULL, &lock, &e) != FERROLOCK_OK) {
      pthread_mutex_lock(&r->mu);
      r->errors++;
      pthread_mutex_unlock(&r->mu);
      ferrolock_error_free(e);
      continue;
    }
    pthread_mutex_lock(&r->mu);
    if (++r->inside > r->most) r->most = r->inside;
    r->grants++;
    pthread_mutex_unlock(&r->mu);
    sleep_ms(20);
    pthread_mutex_lock(&r->mu);
    r->inside--;
    pthread_mutex_unlock(&r->mu);
    ferrolock_lock_release(lock, NULL, NULL);
    ferrolock_lock_free(lock);
  }
  return NULL;
}

typedef struct {
  pthread_mutex_t mu;
  ferrolock_lock *lock;
  int called, release_rc;
} sem_lost_t;

/* The loss callback releases its own permits (the handle is the callback's to use). */
static void sem_on_lost(void *userdata, const ferrolock_error *reason) {
  (void)reason;
  sem_lost_t *s = userdata;
  ferrolock_error *e = NULL;
  int rc = ferrolock_lock_release(s->lock, NULL, &e);
  ferrolock_error_free(e);
  pthread_mutex_lock(&s->mu);
  s->release_rc = rc;
  s->called++;
  pthread_mutex_unlock(&s->mu);
}

/* Semaphore: threads never hold more than the permits; count > 1; bad input named; a
 * release from inside the loss callback. */
static void test_semaphore(void) {
  ferrolock_manager *m = manager_with(one_node(options_ms(NULL)));
  sem_run_t run = {.m = m, .name = fresh_key("sem"), .mu = PTHREAD_MUTEX_INITIALIZER};
  pthread_t t[SEM_THREADS];
  for (int i = 0; i < SEM_THREADS; i++) pthread_create(&t[i], NULL, sem_worker, &run);
  for (int i = 0; i < SEM_THREADS; i++) pthread_join(t[i], NULL);
  CHECK(run.errors == 0, "%d acquires failed", run.errors);
  CHECK(run.grants == SEM_THREADS * 3, "%d grants", run.grants);
  CHECK(run.most <= SEM_PERMITS, "%d holders at once, permits %d", run.most, SEM_PERMITS);
  CHECK(run.most == SEM_PERMITS, "never %d holders at once (most %d)", SEM_PERMITS, run.most);

  /* count > 1: 2 of 3 taken leaves 1, so another 2 is refused and 1 granted. */
  const char *name = fresh_key("sem-count");
  ferrolock_lock *two = NULL, *more = NULL, *one = NULL;
  EXPECT(ferrolock_manager_semaphore_acquire(m, name, 3, 2, NULL, NULL, &two, &err), FERROLOCK_OK, NULL);
  EXPECT(ferrolock_manager_semaphore_try_acquire(m, name, 3, 2, NULL, &more, &err), FERROLOCK_ERR_NOT_ACQUIRED, NULL);
  CHECK(more == NULL);
  EXPECT(ferrolock_manager_semaphore_try_acquire(m, name, 3, 1, NULL, &one, &err), FERROLOCK_OK, NULL);
  EXPECT(ferrolock_manager_semaphore_try_acquire(m, name, 3, 1, NULL, &more, &err), FERROLOCK_ERR_NOT_ACQUIRED, NULL);
  /* A different pool size for the same name is named. */
  EXPECT(ferrolock_manager_semaphore_try_acquire(m, name, 5, 1, NULL, &more, &err), FERROLOCK_ERR_INVALID_ARGUMENT, "5");
  EXPECT(ferrolock_lock_release(two, NULL, &err), FERROLOCK_OK, NULL);
  EXPECT(ferrolock_lock_release(two, NULL, &err), FERROLOCK_ERR_NOT_HELD, NULL);
  EXPECT(ferrolock_manager_semaphore_try_acquire(m, name, 3, 2, NULL, &more, &err), FERROLOCK_OK, NULL);
  EXPECT(ferrolock_lock_release(more, NULL, &err), FERROLOCK_OK, NULL);
  EXPECT(ferrolock_lock_release(one, NULL, &err), FERROLOCK_OK, NULL);
  ferrolock_lock_free(two);
  ferrolock_lock_free(more);
  ferrolock_lock_free(one);

  /* Bad input: each refusal names the bad value. */
  ferrolock_lock *bad = NULL;
  EXPECT(ferrolock_manager_semaphore_acquire(m, NULL, 2, 1, NULL, NULL, &bad, &err), FERROLOCK_ERR_INVALID_ARGUMENT, "name must not be NULL");
  EXPECT(ferrolock_manager_semaphore_acquire(NULL, name, 2, 1, NULL, NULL, &bad, &err), FERROLOCK_ERR_INVALID_ARGUMENT, "manager");
  EXPECT(ferrolock_manager_semaphore_acquire(m, name, 2, 1, NULL, NULL, NULL, &err), FERROLOCK_ERR_INVALID_ARGUMENT, "lock_out");
  EXPECT(ferrolock_manager_semaphore_acquire(m, name, 0, 1, NULL, NULL, &bad, &err), FERROLOCK_ERR_INVALID_ARGUMENT, "permits 0");
  EXPECT(ferrolock_manager_semaphore_try_acquire(m, name, 2, 3, NULL, &bad, &err), FERROLOCK_ERR_INVALID_ARGUMENT, "count 3");
  EXPECT(ferrolock_manager_semaphore_try_acquire(m, name, 2, 0, NULL, &bad, &err), FERROLOCK_ERR_INVALID_ARGUMENT, "count 0");
  EXPECT(ferrolock_manager_semaphore_try_acquire(m, "a{b}", 2, 1, NULL, &bad, &err), FERROLOCK_ERR_INVALID_ARGUMENT, "a{b}");
  CHECK(bad == NULL);
  ferrolock_acquisition *acq = NULL;
  EXPECT(ferrolock_manager_semaphore_acquire_start(m, name, 2, 1, NULL, NULL, NULL, NULL, &err),
         FERROLOCK_ERR_INVALID_ARGUMENT, "acquisition_out");
  ferrolock_manager *several = manager_with(options_ms(NULL));
  if (node_count > 1)
    EXPECT(ferrolock_manager_semaphore_acquire(several, name, 2, 1, NULL, NULL, &bad, &err),
           FERROLOCK_ERR_INVALID_ARGUMENT, "one node");
  ferrolock_manager_free(several);

  /* The completion variant grants as the blocking one. */
  name = fresh_key("sem-start");
  EXPECT(ferrolock_manager_semaphore_acquire_start(m, name, 2, 2, NULL, NULL, NULL, &acq, &err), FERROLOCK_OK, NULL);
  ferrolock_lock *got = NULL;
  int rc;
  while ((rc = ferrolock_acquisition_result(acq, &got, &err)) == FERROLOCK_PENDING) sleep_ms(5);
  EXPECT(rc, FERROLOCK_OK, NULL);
  EXPECT(ferrolock_manager_semaphore_try_acquire(m, name, 2, 1, NULL, &bad, &err), FERROLOCK_ERR_NOT_ACQUIRED, NULL);
  EXPECT(ferrolock_lock_release(got, NULL, &err), FERROLOCK_OK, NULL);
  ferrolock_lock_free(got);
  ferrolock_acquisition_free(acq);
  ferrolock_manager_free(m);

  /* A release from inside the loss callback: the node is paused until the loss is told. */
  ferrolock_manager *short_ttl = manager_with(one_node(options_ms("ttl", (uint64_t)1500, NULL)));
  const char *lost_name = fresh_key("sem-lost");
  sem_lost_t lost = {.mu = PTHREAD_MUTEX_INITIALIZER};
  EXPECT(ferrolock_manager_semaphore_acquire(short_ttl, lost_name, 1, 1, NULL, NULL, &lost.lock, &err), FERROLOCK_OK, NULL);
  EXPECT(ferrolock_lock_on_lost(lost.lock, sem_on_lost, &lost, &err), FERROLOCK_OK, NULL);
  kill(node_pids[0], SIGSTOP);
  double give_up = now_ms() + 30000;
  int called = 0;
  while (!called && now_ms() < give_up) {
    sleep_ms(10);
    pthread_mutex_lock(&lost.mu);
    called = lost.called;
    pthread_mutex_unlock(&lost.mu);
  }
  kill(node_pids[0], SIGCONT);
  CHECK(called == 1, "loss callback called %d times", called);
  CHECK(ferrolock_lock_is_lost(lost.lock));
  /* The release inside the callback returned (no deadlock) with a status, not a crash. */
  CHECK(lost.release_rc != FERROLOCK_OK || !ferrolock_lock_is_held(lost.lock), "rc %d", lost.release_rc);
  /* The permit comes back (released, or its lease ended while the node was paused). */
  ferrolock_lock *again = NULL;
  EXPECT(ferrolock_manager_semaphore_acquire(short_ttl, lost_name, 1, 1, NULL, NULL, &again, &err), FERROLOCK_OK, NULL);
  EXPECT(ferrolock_lock_release(again, NULL, &err), FERROLOCK_OK, NULL);
  ferrolock_lock_free(again);
  ferrolock_lock_free(lost.lock);
  ferrolock_manager_free(short_ttl);
}

static void test_extend(void) {
  ferrolock_options *o = options_ms("ttl", (uint64_t)2000, NULL);
  EXPECT(ferrolock_options_set_bool(o, "watchdog", false, &err), FERROLOCK_OK, NULL);
  ferrolock_manager *m = manager_with(o);
  ferrolock_lock *lock = NULL;
  EXPECT(ferrolock_manager_acquire(m, fresh_key("extend"), NULL, NULL, &lock, &err), FERROLOCK_OK, NULL);
  uint64_t v = 0;
  EXPECT(ferrolock_lock_extend(lock, FERROLOCK_SAME_TTL, NULL, &v, &err), FERROLOCK_OK, NULL);
  CHECK(v > 0 && v <= 2000, "%llu", (unsigned long long)v);
  EXPECT(ferrolock_lock_extend(lock, 6000, NULL, &v, &err), FERROLOCK_OK, NULL);
  CHECK(v > 2000 && v <= 6000, "%llu", (unsigned long long)v);
  EXPECT(ferrolock_lock_release(lock, NULL, &err), FERROLOCK_OK, NULL);
  EXPECT(ferrolock_lock_extend(lock, FERROLOCK_SAME_TTL, NULL, &v, &err), FERROLOCK_ERR_NOT_HELD, "released");
  ferrolock_lock_free(lock);
  ferrolock_manager_free(m);
}

static const char *self_path;

/* The contender process: holds KEY for MS, says "held" on stdout, releases. */
static int hold(const char *key, int ms) {
  ferrolock_manager *m = manager_with(options_ms(NULL));
  ferrolock_lock *lock = NULL;
  if (ferrolock_manager_acquire(m, key, NULL, NULL, &lock, &err) != FERROLOCK_OK) {
    fprintf(stderr, "hold: %s\n", err->message);
    return 1;
  }
  printf("held\n");
  fflush(stdout);
  sleep_ms(ms);
  int st = ferrolock_lock_release(lock, NULL, &err);
  ferrolock_lock_free(lock);
  ferrolock_manager_free(m);
  return st == FERROLOCK_OK ? 0 : 1;
}

static void test_two_processes(void) {
  const char *key = fresh_key("processes");
  char key_copy[128];
  snprintf(key_copy, sizeof key_copy, "%s", key);
  int out[2];
  CHECK(pipe(out) == 0);
  pid_t child = fork();
  CHECK(child >= 0);
  if (child == 0) {
    dup2(out[1], 1);
    close(out[0]);
    execl(self_path, self_path, "hold", key_copy, "1500", (char *)NULL);
    _exit(127);
  }
  close(out[1]);
  char line[16] = {0};
  ssize_t n = read(out[0], line, sizeof line - 1);
  CHECK(n > 0 && strncmp(line, "held", 4) == 0, "child said %zd bytes: %s", n, line);
  ferrolock_manager *m = manager_with(options_ms(NULL));
  ferrolock_lock *lock = NULL;
  EXPECT(ferrolock_manager_try_acquire(m, key_copy, NULL, &lock, &err), FERROLOCK_ERR_NOT_ACQUIRED, NULL);
  /* Granted once the other process lets go. */
  EXPECT(ferrolock_manager_acquire(m, key_copy, NULL, NULL, &lock, &err), FERROLOCK_OK, NULL);
  int status = 0;
  CHECK(waitpid(child, &status, 0) == child && WIFEXITED(status) && WEXITSTATUS(status) == 0,
        "contender exit status %d", status);
  close(out[0]);
  EXPECT(ferrolock_lock_release(lock, NULL, &err), FERROLOCK_OK, NULL);
  ferrolock_lock_free(lock);
  ferrolock_manager_free(m);
}

/* Loss callbacks: what they saw, and when. */
typedef struct {
  pthread_mutex_t mu;
  int calls, code, started, finished, sleep_ms;
  double at_ms;
  char message[512];
} seen_t;

static void on_lost(void *userdata, const ferrolock_error *reason) {
  seen_t *s = userdata;
  pthread_mutex_lock(&s->mu);
  s->calls++;
  s->started = 1;
  s->code = reason->code;
  s->at_ms = now_ms();
  snprintf(s->message, sizeof s->message, "%s", reason->message);
  int nap = s->sleep_ms;
  pthread_mutex_unlock(&s->mu);
  if (nap) sleep_ms(nap);
  pthread_mutex_lock(&s->mu);
  s->finished = 1;
  pthread_mutex_unlock(&s->mu);
}

static int seen_started(seen_t *s) {
  pthread_mutex_lock(&s->mu);
  int v = s->started;
  pthread_mutex_unlock(&s->mu);
  return v;
}

static void test_lost_before_validity_ends(void) {
  ferrolock_manager *m = manager_with(options_ms("ttl", (uint64_t)1500, NULL));
  ferrolock_lock *lock = NULL;
  EXPECT(ferrolock_manager_acquire(m, fresh_key("lost"), NULL, NULL, &lock, &err), FERROLOCK_OK, NULL);
  seen_t seen = {.mu = PTHREAD_MUTEX_INITIALIZER};
  EXPECT(ferrolock_lock_on_lost(lock, on_lost, &seen, &err), FERROLOCK_OK, NULL);
  EXPECT(ferrolock_lock_on_lost(lock, on_lost, &seen, &err), FERROLOCK_ERR_INVALID_ARGUMENT, "already");
  pause_majority(1);
  /* Read after the pause: no renewal can move the deadline from here on. */
  double deadline = now_ms() + (double)ferrolock_lock_validity_ms(lock);
  double give_up = now_ms() + 20000;
  while (!seen_started(&seen) && now_ms() < give_up) sleep_ms(10);
  pause_majority(0);
  CHECK(seen.calls == 1, "lost callback called %d times", seen.calls);
  CHECK(seen.code == FERROLOCK_ERR_LOCK_LOST && strstr(seen.message, "lost"), "%d %s", seen.code, seen.message);
  CHECK(seen.at_ms < deadline, "signalled %.1f ms after the validity ended", seen.at_ms - deadline);
  CHECK(ferrolock_lock_is_lost(lock));
  EXPECT(ferrolock_lock_check(lock, &err), FERROLOCK_ERR_LOCK_LOST, "lost");
  ferrolock_lock_release(lock, NULL, NULL);
  ferrolock_lock_free(lock);
  ferrolock_manager_free(m);
}

/* Two locks of one job, each one's loss callback releasing the other ("give up the whole
 * job"), lost at once (here by release_all, which declares them lost to their holders): a
 * release waits for the other lock's running callback, which waits for this one's. Each must
 * return: a release does not wait for a callback that is itself waiting in a release. */
typedef struct {
  ferrolock_lock *other;
  pthread_barrier_t *both_running;
  pthread_mutex_t *mu;
  int *finished;
} cross_t;

static void cross_on_lost(void *userdata, const ferrolock_error *reason) {
  cross_t *c = userdata;
  (void)reason;
  pthread_barrier_wait(c->both_running);
  ferrolock_lock_release(c->other, NULL, NULL);
  pthread_mutex_lock(c->mu);
  (*c->finished)++;
  pthread_mutex_unlock(c->mu);
}

static void test_loss_callbacks_releasing_each_other(void) {
  ferrolock_manager *m = manager_with(options_ms(NULL));
  ferrolock_lock *a = NULL, *b = NULL;
  EXPECT(ferrolock_manager_acquire(m, fresh_key("cross-a"), NULL, NULL, &a, &err), FERROLOCK_OK, NULL);
  EXPECT(ferrolock_manager_acquire(m, fresh_key("cross-b"), NULL, NULL, &b, &err), FERROLOCK_OK, NULL);
  pthread_barrier_t both_running;
  pthread_barrier_init(&both_running, NULL, 2);
  pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
  int finished = 0;
  cross_t ca = {b, &both_running, &mu, &finished}, cb = {a, &both_running, &mu, &finished};
  EXPECT(ferrolock_lock_on_lost(a, cross_on_lost, &ca, &err), FERROLOCK_OK, NULL);
  EXPECT(ferrolock_lock_on_lost(b, cross_on_lost, &cb, &err), FERROLOCK_OK, NULL);
  size_t released = 0;
  EXPECT(ferrolock_manager_release_all(m, 10000, &released, &err), FERROLOCK_OK, NULL);
  CHECK(released == 2, "released %zu", released);
  double give_up = now_ms() + 20000;
  int done = 0;
  while (now_ms() < give_up) {
    pthread_mutex_lock(&mu);
    done = finished;
    pthread_mutex_unlock(&mu);
    if (done == 2) break;
    sleep_ms(10);
  }
  CHECK(done == 2, "the two loss callbacks waited for each other (%d of 2 returned)", done);
  if (done != 2) return; /* freeing now would wait for them too */
  ferrolock_lock_free(a);
  ferrolock_lock_free(b);
  pthread_barrier_destroy(&both_running);
  ferrolock_manager_free(m);
}

static void test_lost_never_after_free(void) {
  ferrolock_manager *m = manager_with(options_ms("ttl", (uint64_t)1500, NULL));
  /* Freed before any loss: never called, even once the loss would have come. */
  ferrolock_lock *early = NULL, *lock = NULL;
  EXPECT(ferrolock_manager_acquire(m, fresh_key("freed"), NULL, NULL, &early, &err), FERROLOCK_OK, NULL);
  seen_t quiet = {.mu = PTHREAD_MUTEX_INITIALIZER};
  EXPECT(ferrolock_lock_on_lost(early, on_lost, &quiet, &err), FERROLOCK_OK, NULL);
  EXPECT(ferrolock_manager_acquire(m, fresh_key("freed-late"), NULL, NULL, &lock, &err), FERROLOCK_OK, NULL);
  seen_t slow = {.mu = PTHREAD_MUTEX_INITIALIZER, .sleep_ms = 300};
  EXPECT(ferrolock_lock_on_lost(lock, on_lost, &slow, &err), FERROLOCK_OK, NULL);
  ferrolock_lock_free(early);
  pause_majority(1);
  double give_up = now_ms() + 20000;
  while (!seen_started(&slow) && now_ms() < give_up) sleep_ms(5);
  /* The callback is running (it naps 300 ms): free waits for it to finish. */
  ferrolock_lock_free(lock);
  pthread_mutex_lock(&slow.mu);
  int started = slow.started, finished = slow.finished;
  pthread_mutex_unlock(&slow.mu);
  sleep_ms(1600); /* past the freed lock's ttl: its loss would have been signalled by now */
  pause_majority(0);
  CHECK(started, "the loss was never signalled");
  CHECK(finished, "ferrolock_lock_free returned while the lost callback was still running");
  CHECK(quiet.calls == 0, "a freed lock's callback was called %d times", quiet.calls);
  ferrolock_manager_free(m);
}

typedef struct {
  ferrolock_manager *m;
  const char *key;
  ferrolock_cancel *cancel;
  ferrolock_lock *lock;
  int status;
  char message[512];
  int done;
} waiter_t;

static void *wait_for_lock(void *arg) {
  waiter_t *w = arg;
  ferrolock_error *e = NULL;
  w->status = ferrolock_manager_acquire(w->m, w->key, NULL, w->cancel, &w->lock, &e);
  if (e) snprintf(w->message, sizeof w->message, "%s", e->message);
  ferrolock_error_free(e);
  __atomic_store_n(&w->done, 1, __ATOMIC_SEQ_CST);
  return NULL;
}

static void test_cancel_blocked_acquire(void) {
  ferrolock_manager *holder = manager_with(options_ms(NULL)), *m = manager_with(options_ms(NULL));
  const char *key = fresh_key("cancel");
  char key_copy[128];
  snprintf(key_copy, sizeof key_copy, "%s", key);
  ferrolock_lock *held = NULL;
  EXPECT(ferrolock_manager_acquire(holder, key_copy, NULL, NULL, &held, &err), FERROLOCK_OK, NULL);
  waiter_t w = {.m = m, .key = key_copy, .cancel = ferrolock_cancel_new()};
  pthread_t t;
  CHECK(pthread_create(&t, NULL, wait_for_lock, &w) == 0);
  sleep_ms(500);
  CHECK(!__atomic_load_n(&w.done, __ATOMIC_SEQ_CST), "the acquire returned while the key was held");
  ferrolock_cancel_trigger(w.cancel);
  pthread_join(t, NULL);
  CHECK(w.status == FERROLOCK_ERR_CANCELLED && w.lock == NULL && strstr(w.message, "cancelled"),
        "status %d: %s", w.status, w.message);
  CHECK(ferrolock_cancel_is_triggered(w.cancel));
  /* A call given a token already triggered takes nothing. */
  ferrolock_lock *late = NULL;
  EXPECT(ferrolock_manager_acquire(m, fresh_key("cancel-early"), NULL, w.cancel, &late, &err), FERROLOCK_ERR_CANCELLED, NULL);
  CHECK(late == NULL);
  ferrolock_cancel_free(w.cancel);
  /* The probe below sees the holder's key: a leftover would not go unnoticed. Summed over the
     nodes: a grant is a quorum's, and a node that answered after the quorum may not hold it. */
  long visible = 0;
  for (int i = 0; i < node_count; i++) visible += keys_on(i, key_copy);
  CHECK(visible >= 1, "the holder's key is not visible to the probe");
  EXPECT(ferrolock_lock_release(held, NULL, &err), FERROLOCK_OK, NULL);
  ferrolock_lock_free(held);
  /* Nothing of the cancelled waiter is left on any node (no lock, no queue entry). */
  for (int i = 0; i < node_count; i++) {
    long left = -1;
    for (int tries = 0; tries < 200; tries++) {
      left = keys_on(i, key_copy);
      if (left == 0) break;
      sleep_ms(25);
    }
    CHECK(left == 0, "node %d: %ld keys named after %s left", i, left, key_copy);
  }
  ferrolock_manager_free(holder);
  ferrolock_manager_free(m);
}

typedef struct {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int calls;
} done_t;

static void on_done(void *userdata) {
  done_t *d = userdata;
  pthread_mutex_lock(&d->mu);
  d->calls++;
  pthread_cond_broadcast(&d->cv);
  pthread_mutex_unlock(&d->mu);
}

static int wait_done(done_t *d, int seconds) {
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_sec += seconds;
  pthread_mutex_lock(&d->mu);
  while (d->calls == 0 && pthread_cond_timedwait(&d->cv, &d->mu, &until) == 0) {
  }
  int calls = d->calls;
  pthread_mutex_unlock(&d->mu);
  return calls;
}

static void test_completion_acquire(void) {
  ferrolock_manager *holder = manager_with(options_ms(NULL)), *m = manager_with(options_ms(NULL));
  const char *key = fresh_key("completion");
  char key_copy[128];
  snprintf(key_copy, sizeof key_copy, "%s", key);
  ferrolock_lock *held = NULL, *lock = NULL;
  EXPECT(ferrolock_manager_acquire(holder, key_copy, NULL, NULL, &held, &err), FERROLOCK_OK, NULL);
  done_t d = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0};
  ferrolock_acquisition *a = NULL;
  EXPECT(ferrolock_manager_acquire_start(m, key_copy, NULL, FERROLOCK_NO_OWNER, on_done, &d, &a, &err), FERROLOCK_OK, NULL);
  sleep_ms(200);
  EXPECT(ferrolock_acquisition_result(a, &lock, &err), FERROLOCK_PENDING, NULL);
  EXPECT(ferrolock_lock_release(held, NULL, &err), FERROLOCK_OK, NULL);
  ferrolock_lock_free(held);
  CHECK(wait_done(&d, 20) == 1, "done called %d times", d.calls);
  EXPECT(ferrolock_acquisition_result(a, &lock, &err), FERROLOCK_OK, NULL);
  CHECK(lock && ferrolock_lock_is_held(lock));
  ferrolock_lock *again = NULL;
  /* Named: a program polling many acquisitions is told which one it took twice. */
  char taken[192];
  snprintf(taken, sizeof taken, "lock \"%s\": the acquisition's result was already taken", key_copy);
  EXPECT(ferrolock_acquisition_result(a, &again, &err), FERROLOCK_ERR_INVALID_ARGUMENT, taken);
  CHECK(again == NULL);
  ferrolock_acquisition_free(a);

  /* Cancelled while waiting: done is called, the outcome is CANCELLED. */
  done_t d2 = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0};
  EXPECT(ferrolock_manager_acquire_start(m, key_copy, NULL, FERROLOCK_NO_OWNER, on_done, &d2, &a, &err), FERROLOCK_OK, NULL);
  sleep_ms(100);
  ferrolock_acquisition_cancel(a);
  CHECK(wait_done(&d2, 20) == 1);
  ferrolock_lock *none = NULL;
  EXPECT(ferrolock_acquisition_result(a, &none, &err), FERROLOCK_ERR_CANCELLED, NULL);
  CHECK(none == NULL);
  ferrolock_acquisition_free(a);
  /* Freed while waiting, with no callback: nothing leaks, nothing is kept. */
  EXPECT(ferrolock_manager_acquire_start(m, key_copy, NULL, FERROLOCK_NO_OWNER, NULL, NULL, &a, &err), FERROLOCK_OK, NULL);
  ferrolock_acquisition_free(a);
  EXPECT(ferrolock_lock_release(lock, NULL, &err), FERROLOCK_OK, NULL);
  ferrolock_lock_free(lock);
  ferrolock_manager_free(holder);
  ferrolock_manager_free(m);
}

/* An integer redis-cli prints for `args` (a shell fragment: it may end in a pipe) on node i;
 * -1 for none (nil, an error). */
static long redis_int(int i, const char *args) {
  char cmd[320];
  snprintf(cmd, sizeof cmd, "redis-cli -p %d %s", node_ports[i], args);
  FILE *p = popen(cmd, "r");
  long n = -1;
  if (p) {
    if (fscanf(p, "%ld", &n) != 1) n = -1;
    pclose(p);
  }
  return n;
}

/* The queue keys of `key` on node i (ferrolock:queue:{key}, -lease, -since; DESIGN.md,
 * "Waiter queue"). */
static long queue_keys_on(int i, const char *key) {
  char args[256];
  snprintf(args, sizeof args, "--scan --pattern 'ferrolock:queue*:{%s}' | wc -l", key);
  return redis_int(i, args);
}

/* Waits until `flag` is set, at most `seconds`. */
static int flag_within(int *flag, int seconds) {
  double give_up = now_ms() + seconds * 1e3;
  while (!__atomic_load_n(flag, __ATOMIC_SEQ_CST) && now_ms() < give_up) sleep_ms(10);
  return __atomic_load_n(flag, __ATOMIC_SEQ_CST);
}

/* Freeing a manager ends the acquires waiting on it (a blocking one on another thread, a
 * completion-based one) with NOT_ACQUIRED naming the close, and leaves no queue entry of
 * them on any node; the holder's key stays its own. Issue 29 item 4. */
static void test_manager_free_ends_waits(void) {
  ferrolock_manager *holder = manager_with(options_ms("ttl", (uint64_t)60000, NULL));
  ferrolock_manager *m = manager_with(options_ms(NULL));
  char key[128];
  snprintf(key, sizeof key, "%s", fresh_key("free-ends-waits"));
  ferrolock_lock *held = NULL;
  EXPECT(ferrolock_manager_acquire(holder, key, NULL, NULL, &held, &err), FERROLOCK_OK, NULL);
  waiter_t w = {.m = m, .key = key};
  pthread_t t;
  CHECK(pthread_create(&t, NULL, wait_for_lock, &w) == 0);
  done_t d = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0};
  ferrolock_acquisition *a = NULL;
  EXPECT(ferrolock_manager_acquire_start(m, key, NULL, FERROLOCK_NO_OWNER, on_done, &d, &a, &err), FERROLOCK_OK, NULL);
  /* The fault: the waiters sit in the key's queue on every node. */
  for (int i = 0; i < node_count; i++) {
    double give_up = now_ms() + 30000;
    while (queue_keys_on(i, key) < 1 && now_ms() < give_up) sleep_ms(25);
    CHECK(queue_keys_on(i, key) >= 1, "node %d: the waiters never queued", i);
  }
  ferrolock_manager_free(m);
  int ended = flag_within(&w.done, 30);
  if (!ended) { /* Let the waiter go, so the test can end. */
    EXPECT(ferrolock_lock_release(held, NULL, &err), FERROLOCK_OK, NULL);
    CHECK(ended, "the blocked acquire went on waiting after its manager was freed");
  }
  pthread_join(t, NULL);
  CHECK(w.status == FERROLOCK_ERR_NOT_ACQUIRED && w.lock == NULL && strstr(w.message, "closed"),
        "blocked acquire: %s: %s", ferrolock_status_name(w.status), w.message);
  CHECK(wait_done(&d, 30) == 1, "the pending acquisition never completed after its manager was freed");
  ferrolock_lock *none = NULL;
  EXPECT(ferrolock_acquisition_result(a, &none, &err), FERROLOCK_ERR_NOT_ACQUIRED, "closed");
  CHECK(none == NULL);
  ferrolock_acquisition_free(a);
  /* No queue entry of the freed manager, and the key is still the holder's alone. */
  for (int i = 0; i < node_count; i++) CHECK(queue_keys_on(i, key) == 0, "node %d: %ld queue keys left", i, queue_keys_on(i, key));
  CHECK(ferrolock_lock_is_held(held));
  ferrolock_manager *other = manager_with(options_ms(NULL));
  ferrolock_lock *rival = NULL;
  EXPECT(ferrolock_manager_try_acquire(other, key, NULL, &rival, &err), FERROLOCK_ERR_NOT_ACQUIRED, NULL);
  EXPECT(ferrolock_lock_release(held, NULL, &err), FERROLOCK_OK, NULL);
  ferrolock_lock_free(held);
  for (int i = 0; i < node_count; i++) CHECK(keys_on(i, key) == 0, "node %d: %ld keys left", i, keys_on(i, key));
  ferrolock_manager_free(other);
  ferrolock_manager_free(holder);
}

/* Whether node i's process is stopped (its state in /proc is T): the proof a pause happened. */
static int node_stopped(int i) {
  char path[64], stat[512];
  snprintf(path, sizeof path, "/proc/%d/stat", node_pids[i]);
  FILE *f = fopen(path, "r");
  if (!f) return 0;
  size_t n = fread(stat, 1, sizeof stat - 1, f);
  fclose(f);
  stat[n] = '\0';
  const char *paren = strrchr(stat, ')');
  return paren && paren[1] == ' ' && paren[2] == 'T';
}

/* Pauses a majority and says whether each of them is stopped (within 10 s). */
static int pause_majority_proved(void) {
  pause_majority(1);
  for (int i = node_count - (node_count / 2 + 1); i < node_count; i++) {
    double give_up = now_ms() + 10000;
    while (!node_stopped(i) && now_ms() < give_up) sleep_ms(10);
    if (!node_stopped(i)) return 0;
  }
  return 1;
}

/* ferrolock_manager_close beside calls stuck on paused nodes (their first round of requests
 * hangs until the node timeout): a blocking acquire on another thread and a completion-based
 * one end with NOT_ACQUIRED naming the key and the close, well before that node timeout, and
 * close returns before it too; later calls on the closed manager fail at once naming the key,
 * a second close returns, and the free that follows does not wait on the nodes. Nothing of the
 * ended acquires is left once the nodes answer again. A majority is paused, not every node:
 * with one node (valgrind's run) a blocking acquire ended while its only node is silent still
 * undoes its request on its own thread before it returns, up to the node timeout, as after a
 * cancel (a known limit), so this test is not in that run. */
static void test_manager_close_ends_stuck_calls(void) {
  const uint64_t node_timeout = 20000;
  ferrolock_manager *m = manager_with(options_ms("node_timeout", node_timeout, "ttl", 10 * node_timeout, NULL));
  char key[128], started_key[128], later_key[128];
  snprintf(key, sizeof key, "%s", fresh_key("close-stuck"));
  snprintf(started_key, sizeof started_key, "%s", fresh_key("close-stuck-start"));
  snprintf(later_key, sizeof later_key, "%s", fresh_key("close-stuck-later"));
  int paused = pause_majority_proved();
  double start = now_ms(), deadline = start + (double)node_timeout;
  waiter_t w = {.m = m, .key = key};
  pthread_t t;
  int threaded = paused && pthread_create(&t, NULL, wait_for_lock, &w) == 0;
  done_t d = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0};
  ferrolock_acquisition *a = NULL;
  int started = threaded ? ferrolock_manager_acquire_start(m, started_key, NULL, FERROLOCK_NO_OWNER, on_done, &d, &a, NULL) : -3;
  sleep_ms(500);
  int early = __atomic_load_n(&w.done, __ATOMIC_SEQ_CST);
  ferrolock_error *close_err = NULL;
  int closed = threaded ? ferrolock_manager_close(m, &close_err) : -3;
  double close_returned = now_ms();
  int ended = threaded && flag_within(&w.done, (int)(node_timeout / 1000));
  double waiter_ended = now_ms();
  int completed = started == FERROLOCK_OK && wait_done(&d, (int)(node_timeout / 1000)) == 1;
  double completion_ended = now_ms();
  pause_majority(0);
  if (threaded) pthread_join(t, NULL);
  CHECK(paused, "a majority of the nodes never stopped");
  CHECK(threaded && started == FERROLOCK_OK, "could not start the acquires (%d)", started);
  CHECK(!early, "the blocking acquire returned before the close, with a majority paused: %s: %s",
        ferrolock_status_name(w.status), w.message);
  CHECK(closed == FERROLOCK_OK, "ferrolock_manager_close: %s", close_err ? close_err->message : "(no error)");
  ferrolock_error_free(close_err);
  CHECK(close_returned < deadline, "ferrolock_manager_close waited out the node timeout (%.0f ms after the acquire began)",
        close_returned - start);
  CHECK(ended && waiter_ended < deadline, "the blocking acquire went on until its requests' node timeout");
  CHECK(w.status == FERROLOCK_ERR_NOT_ACQUIRED && w.lock == NULL && strstr(w.message, "closed") && strstr(w.message, key),
        "the blocking acquire: %s: %s", ferrolock_status_name(w.status), w.message);
  CHECK(completed && completion_ended < deadline, "the pending acquisition did not complete before the node timeout");
  ferrolock_lock *none = NULL;
  EXPECT(ferrolock_acquisition_result(a, &none, &err), FERROLOCK_ERR_NOT_ACQUIRED, "closed");
  CHECK(none == NULL);
  ferrolock_acquisition_free(a);
  /* Later calls: refused at once, naming the key; release_all and a second close return. */
  EXPECT(ferrolock_manager_acquire(m, later_key, NULL, NULL, &none, &err), FERROLOCK_ERR_INVALID_ARGUMENT, later_key);
  EXPECT(ferrolock_manager_try_acquire(m, later_key, NULL, &none, &err), FERROLOCK_ERR_INVALID_ARGUMENT, "closed");
  EXPECT(ferrolock_manager_first_try(m, later_key, 0, 0, 0, NULL, &none, &err), FERROLOCK_ERR_INVALID_ARGUMENT, "closed");
  CHECK(none == NULL);
  size_t released = 7;
  EXPECT(ferrolock_manager_release_all(m, 1000, &released, &err), FERROLOCK_OK, NULL);
  CHECK(released == 0, "release_all of a closed manager with nothing held released %zu", released);
  EXPECT(ferrolock_manager_close(m, &err), FERROLOCK_OK, NULL);
  ferrolock_manager_free(m);
  EXPECT(ferrolock_manager_close(NULL, &err), FERROLOCK_ERR_INVALID_ARGUMENT, "manager");
  /* The requests sent to the paused nodes ran when they resumed: they are undone. */
  for (int i = 0; i < node_count; i++) {
    double give_up = now_ms() + (double)node_timeout;
    long left = -1;
    while ((left = keys_on(i, "close-stuck")) != 0 && now_ms() < give_up) sleep_ms(25);
    CHECK(left == 0, "node %d: %ld keys of the ended acquires left", i, left);
  }
}

static void delete_everywhere(const char *key);

/* Callbacks that call back in. stderr is captured around the calls: the library prints nothing. */
static char stderr_path[64];
static int stderr_saved = -1;

static void capture_stderr(void) {
  snprintf(stderr_path, sizeof stderr_path, "/tmp/ferrolock-stderr-XXXXXX");
  int fd = mkstemp(stderr_path);
  if (fd < 0) abort();
  fflush(stderr);
  stderr_saved = dup(2);
  dup2(fd, 2);
  close(fd);
}

/* Restores stderr; what was written meanwhile goes to `buf`. Returns its length. */
static long restore_stderr(char *buf, size_t size) {
  fflush(stderr);
  dup2(stderr_saved, 2);
  close(stderr_saved);
  FILE *f = fopen(stderr_path, "r");
  size_t n = f ? fread(buf, 1, size - 1, f) : 0;
  if (f) fclose(f);
  buf[n] = '\0';
  unlink(stderr_path);
  return (long)n;
}

enum { IN_EXTEND, IN_RELEASE, IN_TRY_ACQUIRE, IN_ACQUIRE, IN_RELEASE_ACQUIRED, IN_RESULT, IN_CALLS };
static const char *in_names[IN_CALLS] = {"extend", "release", "try_acquire", "acquire (waiting)",
                                          "release of what it acquired", "acquisition_result"};

/* A callback's view: what it calls back in with, and each call's status. */
typedef struct {
  ferrolock_manager *m;
  ferrolock_lock *own;         /* the loss callback's lock (freed inside the callback) */
  ferrolock_acquisition *a;    /* the done callback's acquisition (freed inside the callback) */
  char free_key[96], held_key[96];
  int status[IN_CALLS];
  char message[IN_CALLS][256];
  int started, finished;
} reentry_t;

static void note(reentry_t *r, int which, int status, ferrolock_error *e) {
  r->status[which] = status;
  snprintf(r->message[which], sizeof r->message[which], "%s", e && e->message ? e->message : "");
  ferrolock_error_free(e);
}

/* Every call the header allows from a loss or done callback, on `own`, then frees `own`. */
static void call_back_in(reentry_t *r, ferrolock_lock *own) {
  __atomic_store_n(&r->started, 1, __ATOMIC_SEQ_CST);
  ferrolock_error *e = NULL;
  int st = ferrolock_lock_extend(own, FERROLOCK_SAME_TTL, NULL, NULL, &e);
  note(r, IN_EXTEND, st, e);
  e = NULL;
  st = ferrolock_lock_release(own, NULL, &e);
  note(r, IN_RELEASE, st, e);
  ferrolock_lock *got = NULL;
  e = NULL;
  st = ferrolock_manager_try_acquire(r->m, r->free_key, NULL, &got, &e);
  note(r, IN_TRY_ACQUIRE, st, e);
  if (got) {
    ferrolock_lock_release(got, NULL, NULL);
    ferrolock_lock_free(got);
    got = NULL;
  }
  /* Held by the test's other manager until it sees this callback started: a real wait. */
  ferrolock_options *wait = ferrolock_options_new();
  ferrolock_options_set_ms(wait, "wait", 20000, NULL);
  e = NULL;
  st = ferrolock_manager_acquire(r->m, r->held_key, wait, NULL, &got, &e);
  note(r, IN_ACQUIRE, st, e);
  ferrolock_options_free(wait);
  e = NULL;
  st = got ? ferrolock_lock_release(got, NULL, &e) : -2;
  note(r, IN_RELEASE_ACQUIRED, st, e);
  ferrolock_lock_free(got);
  ferrolock_lock_free(own);
  __atomic_store_n(&r->finished, 1, __ATOMIC_SEQ_CST);
}

static void lost_calls_back_in(void *userdata, const ferrolock_error *reason) {
  (void)reason;
  reentry_t *r = userdata;
  call_back_in(r, r->own);
}

static void done_calls_back_in(void *userdata) {
  reentry_t *r = userdata;
  ferrolock_acquisition *a = __atomic_load_n(&r->a, __ATOMIC_SEQ_CST);
  ferrolock_lock *own = NULL;
  ferrolock_error *e = NULL;
  int st = a ? ferrolock_acquisition_result(a, &own, &e) : -2;
  note(r, IN_RESULT, st, e);
  call_back_in(r, own);
  ferrolock_acquisition_free(a);
}

static void reentry_init(reentry_t *r, ferrolock_manager *m, const char *name) {
  memset(r, 0, sizeof *r);
  r->m = m;
  for (int i = 0; i < IN_CALLS; i++) r->status[i] = -3; /* never called */
  snprintf(r->free_key, sizeof r->free_key, "%s:free", fresh_key(name));
  snprintf(r->held_key, sizeof r->held_key, "%s:held", fresh_key(name));
}

/* Waits for the callback to start, lets it have held_key, and waits for it to finish. */
static int reentry_wait(reentry_t *r, ferrolock_lock *blocker) {
  double give_up = now_ms() + 60000;
  while (!__atomic_load_n(&r->started, __ATOMIC_SEQ_CST) && now_ms() < give_up) sleep_ms(5);
  ferrolock_lock_release(blocker, NULL, NULL);
  ferrolock_lock_free(blocker);
  while (!__atomic_load_n(&r->finished, __ATOMIC_SEQ_CST) && now_ms() < give_up) sleep_ms(5);
  return __atomic_load_n(&r->finished, __ATOMIC_SEQ_CST);
}

/* No call from a callback panics; those that must succeed did. `must` is a mask of IN_*. */
static int reentry_ok(reentry_t *r, const char *which, int must, char *why, size_t size) {
  for (int i = 0; i < IN_CALLS; i++) {
    int required = (must >> i) & 1;
    if (r->status[i] == FERROLOCK_ERR_PANIC || (required && r->status[i] != FERROLOCK_OK)) {
      snprintf(why, size, "%s callback: %s gave %s (%d): %s", which, in_names[i],
               ferrolock_status_name(r->status[i]), r->status[i], r->message[i]);
      return 0;
    }
  }
  return 1;
}

/* `lossy` has a short ttl, for a loss; `m` and `other` the defaults (`other` holds the keys
 * the callbacks wait for). */
static void callbacks_body(ferrolock_manager *lossy, ferrolock_manager *m, ferrolock_manager *other,
                           char *why, size_t size) {
  int acquires = (1 << IN_TRY_ACQUIRE) | (1 << IN_ACQUIRE) | (1 << IN_RELEASE_ACQUIRED);

  /* A loss callback: its lock's key is deleted behind its back. */
  static reentry_t lost;
  reentry_init(&lost, lossy, "reentry-lost");
  ferrolock_lock *blocker = NULL;
  EXPECT(ferrolock_manager_acquire(other, lost.held_key, NULL, NULL, &blocker, &err), FERROLOCK_OK, NULL);
  char own_key[96];
  snprintf(own_key, sizeof own_key, "%s", fresh_key("reentry-own"));
  EXPECT(ferrolock_manager_acquire(lossy, own_key, NULL, NULL, &lost.own, &err), FERROLOCK_OK, NULL);
  EXPECT(ferrolock_lock_on_lost(lost.own, lost_calls_back_in, &lost, &err), FERROLOCK_OK, NULL);
  delete_everywhere(own_key);
  CHECK(reentry_wait(&lost, blocker), "the loss callback never finished (started: %d)", lost.started);
  if (!reentry_ok(&lost, "loss", acquires, why, size)) return;

  /* A done callback: the acquire it reports is taken, used and freed inside it. */
  static reentry_t done;
  reentry_init(&done, m, "reentry-done");
  EXPECT(ferrolock_manager_acquire(other, done.held_key, NULL, NULL, &blocker, &err), FERROLOCK_OK, NULL);
  EXPECT(ferrolock_manager_acquire_start(m, fresh_key("reentry-start"), NULL, FERROLOCK_NO_OWNER,
                                         done_calls_back_in, &done, &done.a, &err), FERROLOCK_OK, NULL);
  CHECK(reentry_wait(&done, blocker), "the done callback never finished (started: %d)", done.started);
  reentry_ok(&done, "done", acquires | (1 << IN_RESULT) | (1 << IN_EXTEND) | (1 << IN_RELEASE), why, size);
}

static void test_callbacks_call_back_in(void) {
  char why[1024] = "", printed[4096];
  /* A short ttl for a prompt loss, unless a slow node timeout is set (valgrind): then the
   * shortest ttl that timeout fits, or the acquire refuses it. */
  const char *slow = getenv("FERROLOCK_TEST_NODE_TIMEOUT_MS");
  uint64_t ttl = slow ? 10 * strtoull(slow, NULL, 10) : 1500;
  ferrolock_manager *lossy = manager_with(options_ms("ttl", ttl, NULL));
  ferrolock_manager *m = manager_with(options_ms(NULL)), *other = manager_with(options_ms(NULL));
  capture_stderr();
  callbacks_body(lossy, m, other, why, sizeof why);
  long n = restore_stderr(printed, sizeof printed);
  ferrolock_manager_free(lossy);
  ferrolock_manager_free(m);
  ferrolock_manager_free(other);
  if (check_failed) return;
  CHECK(why[0] == '\0', "%.700s", why);
  CHECK(n == 0, "the library printed %ld bytes on stderr: %.600s", n, printed);
}

/* done may run at once (wait=0 on a held key): *acquisition_out is written before it can. */
typedef struct {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  ferrolock_acquisition **slot;
  int calls, unwritten, not_acquired;
} slot_check_t;

static void done_reads_slot(void *userdata) {
  slot_check_t *s = userdata;
  ferrolock_acquisition *a = __atomic_load_n(s->slot, __ATOMIC_SEQ_CST);
  int status = -2;
  if (a) {
    ferrolock_lock *lock = NULL;
    ferrolock_error *e = NULL;
    status = ferrolock_acquisition_result(a, &lock, &e);
    ferrolock_error_free(e);
    ferrolock_lock_free(lock);
  }
  pthread_mutex_lock(&s->mu);
  s->calls++;
  if (!a) s->unwritten++;
  if (status == FERROLOCK_ERR_NOT_ACQUIRED) s->not_acquired++;
  pthread_cond_broadcast(&s->cv);
  pthread_mutex_unlock(&s->mu);
}

static void test_done_after_out_slot(void) {
  ferrolock_manager *holder = manager_with(options_ms(NULL)), *m = manager_with(options_ms(NULL));
  char key[96];
  snprintf(key, sizeof key, "%s", fresh_key("out-slot"));
  ferrolock_lock *held = NULL;
  EXPECT(ferrolock_manager_acquire(holder, key, NULL, NULL, &held, &err), FERROLOCK_OK, NULL);
  ferrolock_options *once = ferrolock_options_new();
  EXPECT(ferrolock_options_set_ms(once, "wait", 0, &err), FERROLOCK_OK, NULL);
  const char *n_env = getenv("FERROLOCK_TEST_SLOT_TRIES");
  int tries = n_env ? atoi(n_env) : 3000;
  slot_check_t s = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, NULL, 0, 0, 0};
  for (int i = 0; i < tries; i++) {
    ferrolock_acquisition *a = NULL;
    s.slot = &a;
    EXPECT(ferrolock_manager_acquire_start(m, key, once, FERROLOCK_NO_OWNER, done_reads_slot, &s, &a, &err),
           FERROLOCK_OK, NULL);
    pthread_mutex_lock(&s.mu);
    while (s.calls == i) pthread_cond_wait(&s.cv, &s.mu);
    pthread_mutex_unlock(&s.mu);
    ferrolock_acquisition_free(a);
  }
  ferrolock_options_free(once);
  EXPECT(ferrolock_lock_release(held, NULL, &err), FERROLOCK_OK, NULL);
  ferrolock_lock_free(held);
  ferrolock_manager_free(holder);
  ferrolock_manager_free(m);
  CHECK(s.unwritten == 0, "done ran before *acquisition_out was written in %d of %d tries", s.unwritten, tries);
  CHECK(s.not_acquired == tries, "%d of %d tries read NOT_ACQUIRED from done", s.not_acquired, tries);
}

/* A completion acquire cancelled just as the holder's release wakes it (its grant on its way):
 * once done reports, whatever it took (a grant, a queue entry) is given back on every node, so
 * another manager's try takes the key at once. Reporting first and undoing after failed such a
 * try in most rounds. */
static void test_cancel_completion_acquire_as_granted(void) {
  ferrolock_manager *holder = manager_with(options_ms(NULL)), *m = manager_with(options_ms(NULL)),
                    *other = manager_with(options_ms(NULL));
  int cancelled = 0;
  for (int round = 0; round < 20; round++) {
    char key[128];
    snprintf(key, sizeof key, "%s", fresh_key("cancel-granted"));
    ferrolock_lock *held = NULL, *got = NULL, *taken = NULL;
    EXPECT(ferrolock_manager_acquire(holder, key, NULL, NULL, &held, &err), FERROLOCK_OK, NULL);
    done_t d = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0};
    ferrolock_acquisition *a = NULL;
    EXPECT(ferrolock_manager_acquire_start(m, key, NULL, FERROLOCK_NO_OWNER, on_done, &d, &a, &err), FERROLOCK_OK, NULL);
    /* Queued on every node (the key and its queue keys are there): the release wakes it. */
    for (int i = 0; i < node_count; i++) {
      long names = 0;
      for (int tries = 0; tries < 800 && (names = keys_on(i, key)) < 2; tries++) sleep_ms(25);
      CHECK(names >= 2, "round %d: the waiter never queued on node %d", round, i);
    }
    EXPECT(ferrolock_lock_release(held, NULL, &err), FERROLOCK_OK, NULL);
    ferrolock_lock_free(held);
    ferrolock_acquisition_cancel(a);
    CHECK(wait_done(&d, 60) == 1, "round %d: done called %d times", round, d.calls);
    int status = ferrolock_acquisition_result(a, &got, &err);
    ferrolock_acquisition_free(a);
    if (status == FERROLOCK_OK) {
      EXPECT(ferrolock_lock_release(got, NULL, &err), FERROLOCK_OK, NULL);
      ferrolock_lock_free(got);
    } else {
      CHECK(status == FERROLOCK_ERR_CANCELLED, "round %d: %s", round, ferrolock_status_name(status));
      ferrolock_error_free(err);
      err = NULL;
      cancelled++;
    }
    int tried = ferrolock_manager_try_acquire(other, key, NULL, &taken, &err);
    CHECK(tried == FERROLOCK_OK, "round %d: another manager's try right after the cancel: %s: %s", round,
          ferrolock_status_name(tried), err && err->message ? err->message : "");
    EXPECT(ferrolock_lock_release(taken, NULL, &err), FERROLOCK_OK, NULL);
    ferrolock_lock_free(taken);
  }
  CHECK(cancelled > 0, "no round was cancelled: the race never happened");
  ferrolock_manager_free(holder);
  ferrolock_manager_free(m);
  ferrolock_manager_free(other);
}

static void test_bad_inputs(void) {
  ferrolock_options *o = ferrolock_options_new();
  ferrolock_manager *m = manager_with(options_ms(NULL)), *none = NULL;
  ferrolock_lock *lock = NULL, *dummy = NULL;
  ferrolock_acquisition *a = NULL;
  uint64_t u = 0;
  /* Options. */
  EXPECT(ferrolock_options_set_ms(NULL, "ttl", 10, &err), FERROLOCK_ERR_INVALID_ARGUMENT, "opts");
  EXPECT(ferrolock_options_set_ms(o, NULL, 10, &err), FERROLOCK_ERR_INVALID_ARGUMENT, "option name");
  EXPECT(ferrolock_options_set_ms(o, "ttl", 0, &err), FERROLOCK_ERR_INVALID_ARGUMENT, "ttl=0ms");
  EXPECT(ferrolock_options_set_ms(o, "no_such", 10, &err), FERROLOCK_ERR_INVALID_ARGUMENT, "unknown option \"no_such\"");
  EXPECT(ferrolock_options_set_ms(o, "ttl\xff", 10, &err), FERROLOCK_ERR_INVALID_ARGUMENT, "UTF-8");
  EXPECT(ferrolock_options_set_bool(NULL, "fencing", true, &err), FERROLOCK_ERR_INVALID_ARGUMENT, "opts");
  EXPECT(ferrolock_options_set_bool(o, NULL, true, &err), FERROLOCK_ERR_INVALID_ARGUMENT, "option name");
  EXPECT(ferrolock_options_set_bool(o, "ttl", true, &err), FERROLOCK_ERR_INVALID_ARGUMENT, "ttl=true");
  /* An explicitly empty node list (left out, it means FERROLOCK_NODES, else localhost). */
  EXPECT(ferrolock_options_set_str(o, "nodes", "", &err), FERROLOCK_ERR_INVALID_ARGUMENT, "no node URL");
  EXPECT(ferrolock_options_set_count(NULL, "max_extensions", 1, &err), FERROLOCK_ERR_INVALID_ARGUMENT, "opts");
  EXPECT(ferrolock_options_set_count(o, NULL, 1, &err), FERROLOCK_ERR_INVALID_ARGUMENT, "option name");
  EXPECT(ferrolock_options_set_count(o, "max_extensions", 1ull << 40, &err), FERROLOCK_ERR_INVALID_ARGUMENT, "max_extensions=1099511627776");
  EXPECT(ferrolock_options_set_number(NULL, "drift_factor", 0.1, &err), FERROLOCK_ERR_INVALID_ARGUMENT, "opts");
  EXPECT(ferrolock_options_set_number(o, NULL, 0.1, &err), FERROLOCK_ERR_INVALID_ARGUMENT, "option name");
  EXPECT(ferrolock_options_set_number(o, "drift_factor", 1.5, &err), FERROLOCK_ERR_INVALID_ARGUMENT, "drift_factor=1.5");
  EXPECT(ferrolock_options_set_number(o, "drift_factor", 1e300, &err), FERROLOCK_ERR_INVALID_ARGUMENT, "drift_factor=1e300:");
  EXPECT(ferrolock_options_set_str(NULL, "nodes", "redis://x", &err), FERROLOCK_ERR_INVALID_ARGUMENT, "opts");
  EXPECT(ferrolock_options_set_str(o, NULL, "redis://x", &err), FERROLOCK_ERR_INVALID_ARGUMENT, "option name");
  EXPECT(ferrolock_options_set_str(o, "nodes", NULL, &err), FERROLOCK_ERR_INVALID_ARGUMENT, "option value");
  EXPECT(ferrolock_options_set_none(NULL, "wait", &err), FERROLOCK_ERR_INVALID_ARGUMENT, "opts");
  EXPECT(ferrolock_options_set_none(o, NULL, &err), FERROLOCK_ERR_INVALID_ARGUMENT, "option name");
  EXPECT(ferrolock_options_set_none(o, "ttl", &err), FERROLOCK_ERR_INVALID_ARGUMENT, "ttl");
  /* The wrong setter for an option is named as the mistake, with the right one. */
  EXPECT(ferrolock_options_set_ms(o, "drift_factor", 1, &err), FERROLOCK_ERR_INVALID_ARGUMENT,
         "drift_factor=1ms: drift_factor is set with ferrolock_options_set_number, not ferrolock_options_set_ms");
  EXPECT(ferrolock_options_set_ms(o, "reentrant", 5, &err), FERROLOCK_ERR_INVALID_ARGUMENT, "ferrolock_options_set_bool");
  EXPECT(ferrolock_options_set_count(o, "ttl", 5, &err), FERROLOCK_ERR_INVALID_ARGUMENT, "ttl=5: ttl is set with ferrolock_options_set_ms");
  EXPECT(ferrolock_options_set_str(o, "ttl", "10s", &err), FERROLOCK_ERR_INVALID_ARGUMENT, "ferrolock_options_set_ms, not ferrolock_options_set_str");
  /* A node URL given to another option, or as the name (the two strings swapped), is echoed
     without its password, as in every message about nodes. */
  EXPECT(ferrolock_options_set_str(o, "ttl", "redis://:sekrit@127.0.0.1:1", &err), FERROLOCK_ERR_INVALID_ARGUMENT,
         "ttl=\"redis://:***@127.0.0.1:1\": ttl is set with ferrolock_options_set_ms");
  EXPECT(ferrolock_options_set_str(o, "redis://u:sekrit@127.0.0.1:1", "nodes", &err), FERROLOCK_ERR_INVALID_ARGUMENT,
         "unknown option \"redis://u:***@127.0.0.1:1\"");
  /* FERROLOCK_WAIT_FOREVER is "none" for the duration options only: to another option it is
     the wrong setter, not a reset of that option to its default (nodes: the local node). */
  const char *forever_ok[] = {"wait", "max_hold", "node_timeout", "restart_guard"};
  for (size_t i = 0; i < sizeof forever_ok / sizeof *forever_ok; i++)
    EXPECT(ferrolock_options_set_ms(o, forever_ok[i], FERROLOCK_WAIT_FOREVER, &err), FERROLOCK_OK, NULL);
  EXPECT(ferrolock_options_set_ms(o, "nodes", FERROLOCK_WAIT_FOREVER, &err), FERROLOCK_ERR_INVALID_ARGUMENT,
         "nodes=FERROLOCK_WAIT_FOREVER: nodes is set with ferrolock_options_set_str, not ferrolock_options_set_ms");
  EXPECT(ferrolock_options_set_ms(o, "tls_ca", FERROLOCK_WAIT_FOREVER, &err), FERROLOCK_ERR_INVALID_ARGUMENT,
         "tls_ca is set with ferrolock_options_set_str, not ferrolock_options_set_ms");
  EXPECT(ferrolock_options_set_ms(o, "max_extensions", FERROLOCK_WAIT_FOREVER, &err), FERROLOCK_ERR_INVALID_ARGUMENT,
         "max_extensions is set with ferrolock_options_set_count, not ferrolock_options_set_ms");
  EXPECT(ferrolock_options_set_ms(o, "watchdog", FERROLOCK_WAIT_FOREVER, &err), FERROLOCK_ERR_INVALID_ARGUMENT,
         "watchdog is set with ferrolock_options_set_bool, not ferrolock_options_set_ms");
  EXPECT(ferrolock_options_set_ms(o, "ttl", FERROLOCK_WAIT_FOREVER, &err), FERROLOCK_ERR_INVALID_ARGUMENT, "ttl=FERROLOCK_WAIT_FOREVER");
  /* Managers. */
  EXPECT(ferrolock_manager_new(NULL, &none, &err), FERROLOCK_ERR_INVALID_ARGUMENT, "opts");
  EXPECT(ferrolock_manager_new(o, NULL, &err), FERROLOCK_ERR_INVALID_ARGUMENT, "manager_out");
  EXPECT(ferrolock_options_set_str(o, "nodes", "http://127.0.0.1:6379", &err), FERROLOCK_OK, NULL);
  EXPECT(ferrolock_manager_new(o, &none, &err), FERROLOCK_ERR_INVALID_ARGUMENT, "http://127.0.0.1:6379");
  CHECK(none == NULL);
  EXPECT(ferrolock_options_set_str(o, "nodes", "redis://127.0.0.1:notaport", &err), FERROLOCK_OK, NULL);
  EXPECT(ferrolock_manager_new(o, &none, &err), FERROLOCK_ERR_INVALID_ARGUMENT, "notaport");
  /* An unreachable node: the manager is made, the acquire reports the quorum. */
  EXPECT(ferrolock_options_set_str(o, "nodes", "redis://127.0.0.1:1", &err), FERROLOCK_OK, NULL);
  EXPECT(ferrolock_manager_new(o, &none, &err), FERROLOCK_OK, NULL);
  EXPECT(ferrolock_manager_acquire(none, "k", NULL, NULL, &lock, &err), FERROLOCK_ERR_QUORUM_UNREACHABLE, "127.0.0.1:1");
  ferrolock_manager_free(none);
  /* Acquires. */
  const char *key = fresh_key("bad");
  EXPECT(ferrolock_manager_acquire(NULL, key, NULL, NULL, &lock, &err), FERROLOCK_ERR_INVALID_ARGUMENT, "manager");
  EXPECT(ferrolock_manager_acquire(m, NULL, NULL, NULL, &lock, &err), FERROLOCK_ERR_INVALID_ARGUMENT, "key");
  EXPECT(ferrolock_manager_acquire(m, key, NULL, NULL, NULL, &err), FERROLOCK_ERR_INVALID_ARGUMENT, "lock_out");
  EXPECT(ferrolock_manager_acquire(m, "", NULL, NULL, &lock, &err), FERROLOCK_ERR_INVALID_ARGUMENT, "empty");
  EXPECT(ferrolock_manager_acquire(m, "bad\xfe", NULL, NULL, &lock, &err), FERROLOCK_ERR_INVALID_ARGUMENT, "UTF-8");
  EXPECT(ferrolock_manager_try_acquire(NULL, key, NULL, &lock, &err), FERROLOCK_ERR_INVALID_ARGUMENT, "manager");
  EXPECT(ferrolock_manager_try_acquire(m, NULL, NULL, &lock, &err), FERROLOCK_ERR_INVALID_ARGUMENT, "key");
  EXPECT(ferrolock_manager_try_acquire(m, key, NULL, NULL, &err), FERROLOCK_ERR_INVALID_ARGUMENT, "lock_out");
  EXPECT(ferrolock_manager_acquire_owned(NULL, key, 1, NULL, NULL, &lock, &err), FERROLOCK_ERR_INVALID_ARGUMENT, "manager");
  EXPECT(ferrolock_manager_acquire_owned(m, NULL, 1, NULL, NULL, &lock, &err), FERROLOCK_ERR_INVALID_ARGUMENT, "key");
  EXPECT(ferrolock_manager_acquire_owned(m, key, 1, NULL, NULL, NULL, &err), FERROLOCK_ERR_INVALID_ARGUMENT, "lock_out");
  EXPECT(ferrolock_manager_acquire_start(NULL, key, NULL, 1, NULL, NULL, &a, &err), FERROLOCK_ERR_INVALID_ARGUMENT, "manager");
  EXPECT(ferrolock_manager_acquire_start(m, NULL, NULL, 1, NULL, NULL, &a, &err), FERROLOCK_ERR_INVALID_ARGUMENT, "key");
  EXPECT(ferrolock_manager_acquire_start(m, key, NULL, 1, NULL, NULL, NULL, &err), FERROLOCK_ERR_INVALID_ARGUMENT, "acquisition_out");
  /* A key or a lease the acquire would refuse fails at the start, as the header says, with no
     acquisition handed out. */
  a = (ferrolock_acquisition *)&u;
  EXPECT(ferrolock_manager_acquire_start(m, "", NULL, FERROLOCK_NO_OWNER, NULL, NULL, &a, &err), FERROLOCK_ERR_INVALID_ARGUMENT, "must not be empty");
  CHECK(a == NULL);
  EXPECT(ferrolock_manager_acquire_start(m, "user}1", NULL, FERROLOCK_NO_OWNER, NULL, NULL, &a, &err), FERROLOCK_ERR_INVALID_ARGUMENT, "user}1");
  CHECK(a == NULL);
  EXPECT(ferrolock_manager_rw_acquire_start(m, "", FERROLOCK_RW_READ, NULL, FERROLOCK_NO_OWNER, NULL, NULL, &a, &err), FERROLOCK_ERR_INVALID_ARGUMENT, "must not be empty");
  CHECK(a == NULL);
  ferrolock_options *long_read = ferrolock_options_new();
  EXPECT(ferrolock_options_set_ms(long_read, "ttl", 31000, &err), FERROLOCK_OK, NULL);
  EXPECT(ferrolock_manager_rw_acquire_start(m, key, FERROLOCK_RW_READ, long_read, FERROLOCK_NO_OWNER, NULL, NULL, &a, &err), FERROLOCK_ERR_INVALID_ARGUMENT, "read lease");
  CHECK(a == NULL);
  ferrolock_options_free(long_read);
  ferrolock_options *fenced_read = ferrolock_options_new();
  EXPECT(ferrolock_options_set_bool(fenced_read, "fencing", true, &err), FERROLOCK_OK, NULL);
  EXPECT(ferrolock_manager_rw_acquire_start(m, key, FERROLOCK_RW_READ, fenced_read, FERROLOCK_NO_OWNER, NULL, NULL, &a, &err), FERROLOCK_ERR_INVALID_ARGUMENT, "writers only");
  CHECK(a == NULL);
  ferrolock_options_free(fenced_read);
  /* Per-acquire options: a manager option is refused. */
  ferrolock_options *per = ferrolock_options_new();
  EXPECT(ferrolock_options_set_str(per, "nodes", "redis://127.0.0.1:2", &err), FERROLOCK_OK, NULL);
  EXPECT(ferrolock_manager_acquire(m, key, per, NULL, &lock, &err), FERROLOCK_ERR_INVALID_ARGUMENT, "belongs to the manager");
  ferrolock_options_free(per);
  /* A node timeout its ttl cannot renew with (loss margin 900 ms, not under 1 s / 3), and a
     ttl too short to renew (seconds meant as ms): refused at acquire, naming them. */
  per = ferrolock_options_new();
  EXPECT(ferrolock_options_set_ms(per, "ttl", 1000, &err), FERROLOCK_OK, NULL);
  EXPECT(ferrolock_options_set_ms(per, "node_timeout", 450, &err), FERROLOCK_OK, NULL);
  EXPECT(ferrolock_manager_acquire(m, key, per, NULL, &lock, &err), FERROLOCK_ERR_INVALID_ARGUMENT, "node timeout 450ms");
  ferrolock_options_free(per);
  per = ferrolock_options_new();
  EXPECT(ferrolock_options_set_ms(per, "ttl", 10, &err), FERROLOCK_OK, NULL);
  EXPECT(ferrolock_manager_acquire(m, key, per, NULL, &lock, &err), FERROLOCK_ERR_INVALID_ARGUMENT, "ttl 10ms");
  ferrolock_options_free(per);
  /* Locks. */
  EXPECT(ferrolock_manager_acquire(m, key, NULL, NULL, &lock, &err), FERROLOCK_OK, NULL);
  EXPECT(ferrolock_lock_fence(NULL, &u, &err), FERROLOCK_ERR_INVALID_ARGUMENT, "lock");
  EXPECT(ferrolock_lock_fence(lock, NULL, &err), FERROLOCK_ERR_INVALID_ARGUMENT, "fence_out");
  EXPECT(ferrolock_lock_fence(lock, &u, &err), FERROLOCK_ERR_INVALID_ARGUMENT, "fencing");
  EXPECT(ferrolock_lock_check(NULL, &err), FERROLOCK_ERR_INVALID_ARGUMENT, "lock");
  EXPECT(ferrolock_lock_on_lost(NULL, on_lost, NULL, &err), FERROLOCK_ERR_INVALID_ARGUMENT, "lock");
  EXPECT(ferrolock_lock_on_lost(lock, NULL, NULL, &err), FERROLOCK_ERR_INVALID_ARGUMENT, "callback");
  EXPECT(ferrolock_lock_extend(NULL, 0, NULL, &u, &err), FERROLOCK_ERR_INVALID_ARGUMENT, "lock");
  EXPECT(ferrolock_lock_extend(lock, 1, NULL, &u, &err), FERROLOCK_ERR_INVALID_ARGUMENT, "ttl");
  EXPECT(ferrolock_lock_extend(lock, UINT64_MAX, NULL, &u, &err), FERROLOCK_ERR_INVALID_ARGUMENT,
         "ttl_ms 18446744073709551615 is too long");
  EXPECT(ferrolock_lock_release(NULL, NULL, &err), FERROLOCK_ERR_INVALID_ARGUMENT, "lock");
  EXPECT(ferrolock_lock_end_scope(NULL, false, NULL, &err), FERROLOCK_ERR_INVALID_ARGUMENT, "lock");
  EXPECT(ferrolock_acquisition_result(NULL, &dummy, &err), FERROLOCK_ERR_INVALID_ARGUMENT, "acquisition");
  CHECK(ferrolock_lock_key(NULL) == NULL && ferrolock_lock_token(NULL) == NULL);
  CHECK(ferrolock_lock_validity_ms(NULL) == 0 && !ferrolock_lock_is_held(NULL) && !ferrolock_lock_is_lost(NULL));
  CHECK(!ferrolock_cancel_is_triggered(NULL));
  /* Errors are optional; statuses still come back. */
  CHECK(ferrolock_manager_acquire(m, "", NULL, NULL, &dummy, NULL) == FERROLOCK_ERR_INVALID_ARGUMENT);
  CHECK(strcmp(ferrolock_status_name(FERROLOCK_ERR_CANCELLED), "CANCELLED") == 0);
  CHECK(strcmp(ferrolock_status_name(12345), "UNKNOWN") == 0);
  /* Every free takes NULL. */
  ferrolock_error_free(NULL);
  ferrolock_options_free(NULL);
  ferrolock_manager_free(NULL);
  ferrolock_lock_free(NULL);
  ferrolock_cancel_free(NULL);
  ferrolock_cancel_trigger(NULL);
  ferrolock_acquisition_cancel(NULL);
  ferrolock_acquisition_free(NULL);
  EXPECT(ferrolock_lock_release(lock, NULL, &err), FERROLOCK_OK, NULL);
  ferrolock_lock_free(lock);
  ferrolock_options_free(o);
  ferrolock_manager_free(m);
}

/* Redis takes keys up to 512 MB: the library's own messages show a key over 128 bytes by its
   start and its length, as the core's do, not the whole megabyte. */
static char long_key_seen[512];

static int names_long_key(int got, const char *shown) {
  int ok = got == FERROLOCK_ERR_INVALID_ARGUMENT && err != NULL && strlen(err->message) < 1000 &&
           strstr(err->message, shown) != NULL;
  if (!ok) {
    snprintf(long_key_seen, sizeof long_key_seen, "got %s, a message of %zu bytes: %.200s",
             ferrolock_status_name(got), err ? strlen(err->message) : 0, err ? err->message : "(none)");
  }
  ferrolock_error_free(err);
  err = NULL;
  return ok;
}

static void ignore_loss(void *userdata, const ferrolock_error *reason) {
  (void)userdata;
  (void)reason;
}

static void test_long_key_messages(void) {
  /* A node timeout a loaded machine does not run out of with a megabyte to send (about
     200 ms, the default, on an idle one in a debug build). */
  ferrolock_manager *m = manager_with(options_ms("ttl", (uint64_t)30000, "node_timeout", (uint64_t)1000, NULL));
  size_t n = (size_t)1 << 20;
  char *key = malloc(n + 1);
  CHECK(key != NULL);
  memset(key, 'k', n);
  key[n] = '\0';
  char shown[128];
  snprintf(shown, sizeof shown, "lock \"%.64s\xe2\x80\xa6\" (1048576 bytes)", key);
  ferrolock_lock *lock = NULL;
  uint64_t u = 0;
  EXPECT(ferrolock_manager_acquire(m, key, NULL, NULL, &lock, &err), FERROLOCK_OK, NULL);
  CHECK(names_long_key(ferrolock_lock_fence(lock, &u, &err), shown), "%s", long_key_seen);
  CHECK(names_long_key(ferrolock_lock_extend(lock, UINT64_MAX, NULL, &u, &err), shown), "%s", long_key_seen);
  EXPECT(ferrolock_lock_on_lost(lock, ignore_loss, NULL, &err), FERROLOCK_OK, NULL);
  CHECK(names_long_key(ferrolock_lock_on_lost(lock, ignore_loss, NULL, &err), shown), "%s", long_key_seen);
  EXPECT(ferrolock_lock_release(lock, NULL, &err), FERROLOCK_OK, NULL);
  ferrolock_lock_free(lock);
  /* The same quoting, for a binding's own messages. */
  char *q = ferrolock_quoted_key(key);
  CHECK(q != NULL && strcmp(q, shown + strlen("lock ")) == 0, "%.200s", q ? q : "(null)");
  ferrolock_string_free(q);
  q = ferrolock_quoted_key("k\n");
  CHECK(q != NULL && strcmp(q, "\"k\\n\"") == 0, "%s", q ? q : "(null)");
  ferrolock_string_free(q);
  CHECK(ferrolock_quoted_key(NULL) == NULL && ferrolock_quoted_key("\xff") == NULL);
  /* Refused as not UTF-8: shown as well, by its start and its length. */
  key[n - 1] = (char)0xff;
  snprintf(shown, sizeof shown, "\"%.64s\xe2\x80\xa6\" (", key);
  ferrolock_lock *bad = NULL;
  CHECK(names_long_key(ferrolock_manager_acquire(m, key, NULL, NULL, &bad, &err), shown), "%s", long_key_seen);
  free(key);
  ferrolock_manager_free(m);
}

typedef struct {
  const char *name;
  void (*run)(void);
} test_t;

/* ---- metrics and logs ---- */

static void test_metrics_text(void) {
  char prefix[64], key[96], line[256];
  snprintf(prefix, sizeof prefix, "ffi-metrics-%d", (int)getpid());
  snprintf(key, sizeof key, "%s:job", prefix);
  ferrolock_manager *m = manager_with(options_ms("ttl", (uint64_t)30000, NULL));
  ferrolock_lock *lock = NULL, *other = NULL;
  EXPECT(ferrolock_manager_acquire(m, key, NULL, NULL, &lock, &err), FERROLOCK_OK, NULL);
  EXPECT(ferrolock_manager_try_acquire(m, key, NULL, &other, &err), FERROLOCK_ERR_NOT_ACQUIRED, NULL);
  /* A binding's first try ahead of its own wait: its attempt counts, its refusal does not. */
  EXPECT(ferrolock_manager_first_try(m, key, 0, 0, 0, NULL, &other, &err), FERROLOCK_ERR_NOT_ACQUIRED, NULL);
  EXPECT(ferrolock_lock_release(lock, NULL, &err), FERROLOCK_OK, NULL);
  ferrolock_lock_free(lock);
  ferrolock_manager_free(m);
  char *text = ferrolock_metrics_text();
  CHECK(text != NULL);
  const char *want[] = {"ferrolock_grants_total{prefix=\"%s\"} 1",
                        "ferrolock_acquire_failures_total{prefix=\"%s\",code=\"NOT_ACQUIRED\"} 1",
                        "ferrolock_acquire_attempts_total{prefix=\"%s\"} 3"};
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
    snprintf(line, sizeof line, want[i], prefix);
    int found = strstr(text, line) != NULL;
    if (!found) {
      snprintf(failure, sizeof failure, "no line %s in the metrics text", line);
      check_failed = 1;
      break;
    }
  }
  ferrolock_string_free(text);
  ferrolock_string_free(NULL);
}

typedef struct {
  pthread_mutex_t mu;
  int calls, lost_warnings;
} logs_t;

static void on_log(void *userdata, int level, const char *message) {
  logs_t *l = userdata;
  pthread_mutex_lock(&l->mu);
  l->calls++;
  if (level == FERROLOCK_LOG_WARN && strstr(message, "lost")) l->lost_warnings++;
  pthread_mutex_unlock(&l->mu);
}

static int logs_get(logs_t *l, int lost) {
  pthread_mutex_lock(&l->mu);
  int v = lost ? l->lost_warnings : l->calls;
  pthread_mutex_unlock(&l->mu);
  return v;
}

static void delete_everywhere(const char *key) {
  char cmd[256];
  for (int i = 0; i < node_count; i++) {
    snprintf(cmd, sizeof cmd, "redis-cli -p %d DEL '%s' > /dev/null", node_ports[i], key);
    if (system(cmd) != 0) abort();
  }
}

/* A lock whose key is deleted behind its back: the watchdog finds it gone and signals the loss. */
static ferrolock_lock *lose_one(ferrolock_manager *m, const char *name) {
  char key[96];
  snprintf(key, sizeof key, "%s", fresh_key(name));
  ferrolock_lock *lock = NULL;
  if (ferrolock_manager_acquire(m, key, NULL, NULL, &lock, NULL) != FERROLOCK_OK) return NULL;
  delete_everywhere(key);
  double give_up = now_ms() + 20000;
  while (!ferrolock_lock_is_lost(lock) && now_ms() < give_up) sleep_ms(10);
  return lock;
}

/* ferrolock_manager_close from inside callbacks: a loss callback closes its lock's manager
 * (ending an acquire waiting on it on another thread), and a done callback closes the manager
 * of its own acquisition. Each close returns (nothing of the callback is waited for), a call
 * made after it inside the callback is refused naming the key, and the free that follows on
 * the test's thread returns. */
typedef struct {
  ferrolock_manager *m;
  ferrolock_lock *own;
  ferrolock_acquisition *a;
  const char *later_key;
  int close_status, later_status, release_status;
  char later_message[256];
  int finished;
} closer_t;

static void close_from_callback(closer_t *c) {
  c->close_status = ferrolock_manager_close(c->m, NULL);
  ferrolock_lock *none = NULL;
  ferrolock_error *e = NULL;
  c->later_status = ferrolock_manager_try_acquire(c->m, c->later_key, NULL, &none, &e);
  snprintf(c->later_message, sizeof c->later_message, "%s", e ? e->message : "");
  ferrolock_error_free(e);
  ferrolock_lock_free(none);
}

static void lost_closes_manager(void *userdata, const ferrolock_error *reason) {
  (void)reason;
  closer_t *c = userdata;
  close_from_callback(c);
  c->release_status = ferrolock_lock_release(c->own, NULL, NULL);
  __atomic_store_n(&c->finished, 1, __ATOMIC_SEQ_CST);
}

static void done_closes_manager(void *userdata) {
  closer_t *c = userdata;
  ferrolock_acquisition *a = __atomic_load_n(&c->a, __ATOMIC_SEQ_CST);
  c->release_status = ferrolock_acquisition_result(a, &c->own, NULL);
  close_from_callback(c);
  __atomic_store_n(&c->finished, 1, __ATOMIC_SEQ_CST);
}

static void test_manager_close_from_callbacks(void) {
  const char *slow = getenv("FERROLOCK_TEST_NODE_TIMEOUT_MS");
  uint64_t ttl = slow ? 10 * strtoull(slow, NULL, 10) : 1500;
  ferrolock_manager *m = manager_with(options_ms("ttl", ttl, NULL));
  ferrolock_manager *holder = manager_with(options_ms(NULL));
  char own_key[96], held_key[96], later_key[96];
  snprintf(own_key, sizeof own_key, "%s", fresh_key("close-in-lost"));
  snprintf(held_key, sizeof held_key, "%s", fresh_key("close-in-lost-held"));
  snprintf(later_key, sizeof later_key, "%s", fresh_key("close-in-lost-later"));
  ferrolock_lock *blocker = NULL;
  EXPECT(ferrolock_manager_acquire(holder, held_key, NULL, NULL, &blocker, &err), FERROLOCK_OK, NULL);
  closer_t lost = {.m = m, .later_key = later_key, .close_status = -3, .later_status = -3};
  EXPECT(ferrolock_manager_acquire(m, own_key, NULL, NULL, &lost.own, &err), FERROLOCK_OK, NULL);
  EXPECT(ferrolock_lock_on_lost(lost.own, lost_closes_manager, &lost, &err), FERROLOCK_OK, NULL);
  waiter_t w = {.m = m, .key = held_key};
  pthread_t t;
  CHECK(pthread_create(&t, NULL, wait_for_lock, &w) == 0);
  for (int i = 0; i < node_count; i++) {
    double give_up = now_ms() + 30000;
    while (queue_keys_on(i, held_key) < 1 && now_ms() < give_up) sleep_ms(25);
  }
  delete_everywhere(own_key);
  int finished = flag_within(&lost.finished, 30);
  int ended = flag_within(&w.done, 30);
  if (!ended) ferrolock_lock_release(blocker, NULL, NULL);
  pthread_join(t, NULL);
  CHECK(finished, "the loss callback that closes its manager never finished");
  CHECK(lost.close_status == FERROLOCK_OK, "close in the loss callback: %d", lost.close_status);
  CHECK(lost.later_status == FERROLOCK_ERR_INVALID_ARGUMENT && strstr(lost.later_message, later_key),
        "try_acquire after the close, in the callback: %s: %s", ferrolock_status_name(lost.later_status), lost.later_message);
  CHECK(lost.release_status == FERROLOCK_OK, "release of the lost lock in its callback: %d", lost.release_status);
  CHECK(ended && w.status == FERROLOCK_ERR_NOT_ACQUIRED && strstr(w.message, "closed"),
        "the acquire waiting on the manager closed in a loss callback: %s: %s", ferrolock_status_name(w.status), w.message);
  ferrolock_lock_free(lost.own);
  ferrolock_manager_free(m);

  /* A done callback closing its acquisition's manager. */
  ferrolock_manager *m2 = manager_with(options_ms(NULL));
  closer_t done = {.m = m2, .later_key = later_key, .close_status = -3, .later_status = -3};
  char start_key[96];
  snprintf(start_key, sizeof start_key, "%s", fresh_key("close-in-done"));
  EXPECT(ferrolock_manager_acquire_start(m2, start_key, NULL, FERROLOCK_NO_OWNER, done_closes_manager, &done, &done.a, &err),
         FERROLOCK_OK, NULL);
  CHECK(flag_within(&done.finished, 30), "the done callback that closes its manager never finished");
  CHECK(done.release_status == FERROLOCK_OK && done.own, "the acquisition's result in done: %d", done.release_status);
  CHECK(done.close_status == FERROLOCK_OK, "close in the done callback: %d", done.close_status);
  CHECK(done.later_status == FERROLOCK_ERR_INVALID_ARGUMENT && strstr(done.later_message, later_key),
        "try_acquire after the close, in done: %s: %s", ferrolock_status_name(done.later_status), done.later_message);
  /* The lock granted before the close stays usable, as the header says. */
  EXPECT(ferrolock_lock_release(done.own, NULL, &err), FERROLOCK_OK, NULL);
  ferrolock_lock_free(done.own);
  ferrolock_acquisition_free(done.a);
  ferrolock_manager_free(m2);
  EXPECT(ferrolock_lock_release(blocker, NULL, &err), FERROLOCK_OK, NULL);
  ferrolock_lock_free(blocker);
  ferrolock_manager_free(holder);
}

/* Every call on a closed manager (before its free) fails naming the key and the close, or,
 * for a completion-based start, completes so; none waits, none crashes. */
static void test_calls_on_a_closed_manager(void) {
  ferrolock_manager *m = manager_with(one_node(options_ms(NULL)));
  EXPECT(ferrolock_manager_close(m, &err), FERROLOCK_OK, NULL);
  char key[96];
  snprintf(key, sizeof key, "%s", fresh_key("closed-calls"));
  ferrolock_lock *none = NULL;
  ferrolock_cancel *cancel = ferrolock_cancel_new();
  EXPECT(ferrolock_manager_acquire(m, key, NULL, cancel, &none, &err), FERROLOCK_ERR_INVALID_ARGUMENT, key);
  EXPECT(ferrolock_manager_try_acquire(m, key, NULL, &none, &err), FERROLOCK_ERR_INVALID_ARGUMENT, key);
  EXPECT(ferrolock_manager_acquire_owned(m, key, 7, NULL, NULL, &none, &err), FERROLOCK_ERR_INVALID_ARGUMENT, key);
  EXPECT(ferrolock_manager_rw_acquire(m, key, FERROLOCK_RW_READ, 7, NULL, NULL, &none, &err), FERROLOCK_ERR_INVALID_ARGUMENT, key);
  EXPECT(ferrolock_manager_read_acquire(m, key, NULL, NULL, &none, &err), FERROLOCK_ERR_INVALID_ARGUMENT, key);
  EXPECT(ferrolock_manager_write_acquire(m, key, NULL, NULL, &none, &err), FERROLOCK_ERR_INVALID_ARGUMENT, key);
  EXPECT(ferrolock_manager_rw_try_acquire(m, key, FERROLOCK_RW_WRITE, NULL, &none, &err), FERROLOCK_ERR_INVALID_ARGUMENT, key);
  EXPECT(ferrolock_manager_first_try(m, key, FERROLOCK_SEMAPHORE, 2, 1, NULL, &none, &err), FERROLOCK_ERR_INVALID_ARGUMENT, key);
  EXPECT(ferrolock_manager_semaphore_acquire(m, key, 2, 1, NULL, NULL, &none, &err), FERROLOCK_ERR_INVALID_ARGUMENT, key);
  EXPECT(ferrolock_manager_semaphore_try_acquire(m, key, 2, 1, NULL, &none, &err), FERROLOCK_ERR_INVALID_ARGUMENT, key);
  CHECK(none == NULL);
  ferrolock_cancel_free(cancel);
  for (int kind = 0; kind < 3; kind++) {
    done_t d = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0};
    ferrolock_acquisition *a = NULL;
    int started = kind == 0   ? ferrolock_manager_acquire_start(m, key, NULL, FERROLOCK_NO_OWNER, on_done, &d, &a, &err)
                  : kind == 1 ? ferrolock_manager_rw_acquire_start(m, key, FERROLOCK_RW_READ, NULL, FERROLOCK_NO_OWNER, on_done, &d, &a, &err)
                              : ferrolock_manager_semaphore_acquire_start(m, key, 2, 1, NULL, on_done, &d, &a, &err);
    EXPECT(started, FERROLOCK_OK, NULL);
    CHECK(wait_done(&d, 30) == 1, "start %d on a closed manager never completed", kind);
    EXPECT(ferrolock_acquisition_result(a, &none, &err), FERROLOCK_ERR_INVALID_ARGUMENT, key);
    CHECK(none == NULL);
    ferrolock_acquisition_free(a);
  }
  size_t released = 7;
  EXPECT(ferrolock_manager_release_all(m, 100, &released, &err), FERROLOCK_OK, NULL);
  CHECK(released == 0, "%zu", released);
  EXPECT(ferrolock_manager_close(m, &err), FERROLOCK_OK, NULL);
  ferrolock_manager_free(m);
}

static void test_log_callback(void) {
  logs_t logs = {.mu = PTHREAD_MUTEX_INITIALIZER};
  EXPECT(ferrolock_set_log_callback(on_log, &logs, 0, &err), FERROLOCK_ERR_INVALID_ARGUMENT, "max_level=0");
  EXPECT(ferrolock_set_log_callback(on_log, &logs, FERROLOCK_LOG_WARN, &err), FERROLOCK_OK, NULL);
  ferrolock_manager *m = manager_with(options_ms("ttl", (uint64_t)1500, NULL));
  ferrolock_lock *lock = lose_one(m, "logged");
  CHECK(lock && ferrolock_lock_is_lost(lock), "the lock was never lost");
  double give_up = now_ms() + 20000;
  while (logs_get(&logs, 1) == 0 && now_ms() < give_up) sleep_ms(10);
  CHECK(logs_get(&logs, 1) == 1, "%d warnings of the loss logged", logs_get(&logs, 1));
  /* Off: once the call has returned, nothing more arrives, whatever the core logs. */
  EXPECT(ferrolock_set_log_callback(NULL, NULL, 0, &err), FERROLOCK_OK, NULL);
  int calls = logs_get(&logs, 0);
  ferrolock_lock *second = lose_one(m, "unlogged");
  CHECK(second && ferrolock_lock_is_lost(second), "the second lock was never lost");
  sleep_ms(100);
  CHECK(logs_get(&logs, 0) == calls, "%d calls after the callback was cleared", logs_get(&logs, 0) - calls);
  ferrolock_lock_free(lock);
  ferrolock_lock_free(second);
  ferrolock_manager_free(m);
}


typedef struct {
  pthread_mutex_t mu;
  char key[128];
  int named, others;
} collected_logs_t;

static void on_collected_log(void *userdata, int level, const char *message) {
  collected_logs_t *l = userdata;
  if (level != FERROLOCK_LOG_WARN || !strstr(message, "garbage-collected")) return;
  pthread_mutex_lock(&l->mu);
  if (strstr(message, l->key)) l->named++;
  else l->others++;
  pthread_mutex_unlock(&l->mu);
}

/* ferrolock_lock_free_collected (a garbage collector's finalizer, Go's): a held lock is
 * released with a warning naming its key, its loss callback told first; a released one is freed without a warning; NULL is
 * ignored. */
/* A loss callback that releases its own lock (as ferrolock_lost_fn allows), run while that
 * lock is being freed. */
typedef struct {
  pthread_mutex_t mu;
  ferrolock_lock *lock;
  int entered, freeing, calls, status;
  char key[128];
} self_release_t;

static void on_lost_release_self(void *userdata, const ferrolock_error *reason) {
  (void)reason;
  self_release_t *s = userdata;
  pthread_mutex_lock(&s->mu);
  s->entered = 1;
  pthread_mutex_unlock(&s->mu);
  /* Until the free has started on the other thread (it waits for this callback). */
  while (!__atomic_load_n(&s->freeing, __ATOMIC_SEQ_CST)) sleep_ms(5);
  sleep_ms(200);
  int status = ferrolock_lock_release(s->lock, NULL, NULL);
  const char *key = ferrolock_lock_key(s->lock);
  pthread_mutex_lock(&s->mu);
  s->calls++;
  s->status = status;
  snprintf(s->key, sizeof s->key, "%s", key ? key : "(null)");
  pthread_mutex_unlock(&s->mu);
}

/* The handle stays valid for its own loss callback until the free has waited for it: the
 * callback's release of its lock used the freed handle (a crash in free_collected, which runs
 * the callback on the freeing thread; a use after free, which the sanitizer run reports, in a
 * free that waits for a callback running on a library thread). */
static void test_lost_callback_releases_its_lock_during_free(void) {
  ferrolock_manager *m = manager_with(options_ms("ttl", (uint64_t)60000, NULL));
  char key[96];
  /* free_collected: the callback runs inside it, on this thread. */
  snprintf(key, sizeof key, "%s", fresh_key("collected-self-release"));
  self_release_t c = {.mu = PTHREAD_MUTEX_INITIALIZER, .freeing = 1};
  EXPECT(ferrolock_manager_acquire(m, key, NULL, NULL, &c.lock, &err), FERROLOCK_OK, NULL);
  EXPECT(ferrolock_lock_on_lost(c.lock, on_lost_release_self, &c, &err), FERROLOCK_OK, NULL);
  ferrolock_lock_free_collected(c.lock);
  CHECK(c.calls == 1, "the callback ran %d times inside free_collected", c.calls);
  CHECK(c.status == FERROLOCK_OK && strcmp(c.key, key) == 0, "its release: %s, its key %s",
        ferrolock_status_name(c.status), c.key);
  /* ferrolock_lock_free while the callback runs on a library thread. */
  snprintf(key, sizeof key, "%s", fresh_key("freed-self-release"));
  self_release_t f = {.mu = PTHREAD_MUTEX_INITIALIZER};
  EXPECT(ferrolock_manager_acquire(m, key, NULL, NULL, &f.lock, &err), FERROLOCK_OK, NULL);
  EXPECT(ferrolock_lock_on_lost(f.lock, on_lost_release_self, &f, &err), FERROLOCK_OK, NULL);
  delete_everywhere(key);
  EXPECT(ferrolock_lock_extend(f.lock, FERROLOCK_SAME_TTL, NULL, NULL, &err), FERROLOCK_ERR_LOCK_LOST, key);
  double give_up = now_ms() + 20000;
  int entered = 0;
  while (!entered && now_ms() < give_up) {
    pthread_mutex_lock(&f.mu);
    entered = f.entered;
    pthread_mutex_unlock(&f.mu);
    if (!entered) sleep_ms(5);
  }
  CHECK(entered, "the loss callback never ran");
  __atomic_store_n(&f.freeing, 1, __ATOMIC_SEQ_CST);
  ferrolock_lock_free(f.lock);
  pthread_mutex_lock(&f.mu);
  int calls = f.calls, status = f.status;
  pthread_mutex_unlock(&f.mu);
  CHECK(calls == 1, "ferrolock_lock_free returned before its running callback did");
  CHECK(status == FERROLOCK_OK && strcmp(f.key, key) == 0, "its release: %s, its key %s",
        ferrolock_status_name(status), f.key);
  ferrolock_manager_free(m);
}

static void test_free_collected(void) {
  collected_logs_t logs = {.mu = PTHREAD_MUTEX_INITIALIZER};
  EXPECT(ferrolock_set_log_callback(on_collected_log, &logs, FERROLOCK_LOG_WARN, &err), FERROLOCK_OK, NULL);
  ferrolock_manager *m = manager_with(options_ms("ttl", (uint64_t)60000, NULL));
  ferrolock_lock *released = NULL, *held = NULL, *again = NULL;
  char key[96];
  snprintf(key, sizeof key, "%s", fresh_key("collected-held"));
  /* Before any free: a warning for the released lock counts among the others. */
  snprintf(logs.key, sizeof logs.key, "\"%s\"", key);
  EXPECT(ferrolock_manager_acquire(m, fresh_key("collected-released"), NULL, NULL, &released, &err), FERROLOCK_OK, NULL);
  EXPECT(ferrolock_lock_release(released, NULL, &err), FERROLOCK_OK, NULL);
  ferrolock_lock_free_collected(released);
  EXPECT(ferrolock_manager_acquire(m, key, NULL, NULL, &held, &err), FERROLOCK_OK, NULL);
  seen_t seen = {.mu = PTHREAD_MUTEX_INITIALIZER};
  EXPECT(ferrolock_lock_on_lost(held, on_lost, &seen, &err), FERROLOCK_OK, NULL);
  ferrolock_lock_free_collected(held);
  /* Whatever still watched the lock's loss was told before the handle went (on this thread). */
  CHECK(seen.calls == 1 && seen.finished, "lost callback called %d times before the free returned", seen.calls);
  CHECK(seen.code == FERROLOCK_ERR_LOCK_LOST && strstr(seen.message, "garbage-collected") && strstr(seen.message, key),
        "%d %s", seen.code, seen.message);
  ferrolock_lock_free_collected(NULL);
  /* Released in the background: another acquire gets the key well before its 60 s ttl. */
  ferrolock_options *wait = ferrolock_options_new();
  EXPECT(ferrolock_options_set_ms(wait, "wait", 30000, &err), FERROLOCK_OK, NULL);
  EXPECT(ferrolock_manager_acquire(m, key, wait, NULL, &again, &err), FERROLOCK_OK, NULL);
  ferrolock_options_free(wait);
  EXPECT(ferrolock_lock_release(again, NULL, &err), FERROLOCK_OK, NULL);
  ferrolock_lock_free(again);
  EXPECT(ferrolock_set_log_callback(NULL, NULL, 0, &err), FERROLOCK_OK, NULL);
  /* Removing the callback waited for those running: the counts are final. */
  CHECK(logs.named == 1 && logs.others == 0, "%d warnings naming %s, %d others", logs.named, logs.key, logs.others);
  ferrolock_manager_free(m);
}

static void test_release_all(void) {
  ferrolock_manager *m = manager_with(options_ms(NULL));
  const char *part = fresh_key("release-all");
  char k[3][160];
  ferrolock_lock *locks[3] = {NULL, NULL, NULL};
  for (int i = 0; i < 3; i++) {
    snprintf(k[i], sizeof k[i], "%s:%d", part, i);
    EXPECT(ferrolock_manager_acquire(m, k[i], NULL, NULL, &locks[i], &err), FERROLOCK_OK, NULL);
  }
  /* One released by its holder: release_all counts the two still held. */
  EXPECT(ferrolock_lock_release(locks[0], NULL, &err), FERROLOCK_OK, NULL);
  for (int n = 0; n < node_count; n++) CHECK(keys_on(n, part) == 2, "node %d: %ld keys", n, keys_on(n, part));
  size_t released = 99;
  EXPECT(ferrolock_manager_release_all(m, 10000, &released, &err), FERROLOCK_OK, NULL);
  CHECK(released == 2, "released %zu", released);
  for (int n = 0; n < node_count; n++) CHECK(keys_on(n, part) == 0, "node %d: %ld keys left", n, keys_on(n, part));
  /* The handles stay valid; each was lost to its holder, whose release finds it gone. */
  CHECK(!ferrolock_lock_is_held(locks[1]));
  bool was_held = true;
  EXPECT(ferrolock_lock_release(locks[2], &was_held, &err), FERROLOCK_OK, NULL);
  CHECK(!was_held, "a lock its manager released was released again");
  /* Nothing left: 0, and the manager still hands out locks. */
  EXPECT(ferrolock_manager_release_all(m, 1000, NULL, &err), FERROLOCK_OK, NULL);
  ferrolock_lock *again = NULL;
  EXPECT(ferrolock_manager_try_acquire(m, k[1], NULL, &again, &err), FERROLOCK_OK, NULL);
  EXPECT(ferrolock_lock_release(again, NULL, &err), FERROLOCK_OK, NULL);
  ferrolock_lock_free(again);
  EXPECT(ferrolock_manager_release_all(NULL, 1000, NULL, &err), FERROLOCK_ERR_INVALID_ARGUMENT, "manager");
  for (int i = 0; i < 3; i++) ferrolock_lock_free(locks[i]);
  ferrolock_manager_free(m);
}

/* The child of test_shutdown: holds two keys, runs the exit protocol, then tries again. */
static int shutdown_child(const char *part) {
  ferrolock_manager *m = manager_with(options_ms(NULL));
  char k[160];
  ferrolock_lock *locks[2] = {NULL, NULL};
  for (int i = 0; i < 2; i++) {
    snprintf(k, sizeof k, "%s:%d", part, i);
    if (ferrolock_manager_acquire(m, k, NULL, NULL, &locks[i], &err) != FERROLOCK_OK) return 10;
  }
  size_t released = ferrolock_shutdown(10000);
  if (released != 2) {
    fprintf(stderr, "shutdown released %zu\n", released);
    return 11;
  }
  ferrolock_lock *late = NULL;
  int st = ferrolock_manager_try_acquire(m, k, NULL, &late, &err);
  if (st != FERROLOCK_ERR_NOT_ACQUIRED || !err || !strstr(err->message, "exiting")) {
    fprintf(stderr, "after shutdown: %s\n", ferrolock_status_name(st));
    return 12;
  }
  ferrolock_error_free(err);
  for (int i = 0; i < 2; i++) ferrolock_lock_free(locks[i]);
  ferrolock_manager_free(m);
  return 0;
}

static void test_shutdown(void) {
  /* In a process of its own: the exit protocol stops every later acquire of its process. */
  const char *part = fresh_key("shutdown");
  char part_copy[128];
  snprintf(part_copy, sizeof part_copy, "%s", part);
  pid_t child = fork();
  CHECK(child >= 0);
  if (child == 0) {
    execl(self_path, self_path, "shutdown", part_copy, (char *)NULL);
    _exit(127);
  }
  int status = 0;
  CHECK(waitpid(child, &status, 0) == child);
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child status %d", WEXITSTATUS(status));
  for (int n = 0; n < node_count; n++) CHECK(keys_on(n, part_copy) == 0, "node %d: %ld keys left", n, keys_on(n, part_copy));
}

/* Waits for `child` at most `seconds`; a child still running then is killed (a hang). Returns
 * its exit status, or -1 if it hung or died of a signal. */
static int child_status(pid_t child, int seconds) {
  int status = 0;
  double give_up = now_ms() + seconds * 1e3;
  pid_t got;
  while ((got = waitpid(child, &status, WNOHANG)) == 0 && now_ms() < give_up) sleep_ms(20);
  if (got == 0) {
    kill(child, SIGKILL);
    waitpid(child, &status, 0);
    return -1;
  }
  return got == child && WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* The body of test_fork_child (issue 30 item 6 (a)): in a child forked (no exec) from a
 * process that holds `inherited` through `m`, the manager works and the inherited lock is
 * inert, with a clear error; the child's own lock is released by ferrolock_shutdown. */
static int forked_child(ferrolock_manager *m, ferrolock_lock *inherited, const char *own_key) {
  ferrolock_error *e = NULL;
  if (ferrolock_lock_is_held(inherited)) return 20;
  int st = ferrolock_lock_release(inherited, NULL, &e);
  int refused = st == FERROLOCK_ERR_NOT_HELD && e && strstr(e->message, "forked child");
  ferrolock_error_free(e);
  e = NULL;
  if (!refused) return 21;
  st = ferrolock_lock_extend(inherited, FERROLOCK_SAME_TTL, NULL, NULL, &e);
  refused = st == FERROLOCK_ERR_NOT_HELD && e && strstr(e->message, "forked child");
  ferrolock_error_free(e);
  e = NULL;
  if (!refused) return 22;
  ferrolock_lock_free(inherited); /* releases nothing: the parent checks its key */
  ferrolock_lock *own = NULL;
  if (ferrolock_manager_acquire(m, own_key, NULL, NULL, &own, &e) != FERROLOCK_OK) {
    ferrolock_error_free(e);
    return 23;
  }
  if (!ferrolock_lock_is_held(own)) return 24;
  size_t released = ferrolock_shutdown(10000);
  ferrolock_lock_free(own);
  ferrolock_manager_free(m);
  return released == 1 ? 0 : 25;
}

static void test_fork_child(void) {
  ferrolock_manager *m = manager_with(options_ms("ttl", (uint64_t)60000, NULL));
  char parents[128], childs[128];
  snprintf(parents, sizeof parents, "%s", fresh_key("fork-parent"));
  snprintf(childs, sizeof childs, "%s", fresh_key("fork-child"));
  ferrolock_lock *held = NULL;
  EXPECT(ferrolock_manager_acquire(m, parents, NULL, NULL, &held, &err), FERROLOCK_OK, NULL);
  fflush(stdout);
  pid_t child = fork();
  CHECK(child >= 0);
  if (child == 0) _exit(forked_child(m, held, childs));
  int status = child_status(child, 60);
  CHECK(status == 0, "child status %d (-1: hung or crashed)", status);
  /* The child's own lock was released by its shutdown; the parent's is untouched. */
  for (int n = 0; n < node_count; n++) CHECK(keys_on(n, childs) == 0, "node %d: %ld of the child's keys left", n, keys_on(n, childs));
  CHECK(ferrolock_lock_is_held(held));
  for (int n = 0; n < node_count; n++) CHECK(keys_on(n, parents) == 1, "node %d: the parent's key is gone", n);
  EXPECT(ferrolock_lock_release(held, NULL, &err), FERROLOCK_OK, NULL);
  ferrolock_lock_free(held);
  ferrolock_manager_free(m);
}

/* A child forked while the parent's `done` callback runs: the callback's thread was not
 * copied, so it never finishes in the child. The inherited acquisition is the parent's: its
 * result is NOT_HELD and its free returns at once. Before, the free waited for that
 * callback for ever (found by a review). */
static volatile int fork_done_state; /* 1: running, 2: let it return, 3: returned */

static void slow_done(void *userdata) {
  (void)userdata;
  fork_done_state = 1;
  while (fork_done_state == 1) sleep_ms(5);
  fork_done_state = 3;
}

static int forked_during_done(ferrolock_acquisition *a) {
  ferrolock_lock *got = NULL;
  ferrolock_error *e = NULL;
  int st = ferrolock_acquisition_result(a, &got, &e);
  int refused = st == FERROLOCK_ERR_NOT_HELD && got == NULL && e && strstr(e->message, "forked child");
  ferrolock_error_free(e);
  if (!refused) return 30;
  ferrolock_acquisition_cancel(a);
  ferrolock_acquisition_free(a); /* must not wait for the parent's callback */
  return 0;
}

static void test_fork_during_done(void) {
  ferrolock_manager *m = manager_with(options_ms("ttl", (uint64_t)60000, NULL));
  const char *k = fresh_key("fork-done");
  ferrolock_acquisition *a = NULL;
  fork_done_state = 0;
  EXPECT(ferrolock_manager_acquire_start(m, k, NULL, FERROLOCK_NO_OWNER, slow_done, NULL, &a, &err), FERROLOCK_OK, NULL);
  double give_up = now_ms() + 30000;
  while (fork_done_state != 1 && now_ms() < give_up) sleep_ms(5);
  CHECK(fork_done_state == 1, "done was never called");
  fflush(stdout);
  pid_t child = fork();
  CHECK(child >= 0);
  if (child == 0) _exit(forked_during_done(a));
  int status = child_status(child, 60);
  fork_done_state = 2;
  CHECK(status == 0, "child status %d (-1: hung in the free of its inherited acquisition)", status);
  ferrolock_lock *got = NULL;
  EXPECT(ferrolock_acquisition_result(a, &got, &err), FERROLOCK_OK, NULL);
  CHECK(got && ferrolock_lock_is_held(got), "the parent's acquire was not granted");
  ferrolock_acquisition_free(a);
  CHECK(fork_done_state == 3, "free returned before the parent's done did");
  EXPECT(ferrolock_lock_release(got, NULL, &err), FERROLOCK_OK, NULL);
  ferrolock_lock_free(got);
  ferrolock_manager_free(m);
}

/* The end of a scope (ferrolock_lock_end_scope, Go's WithLock): the rule every binding
 * shares. Released: OK. Gone at the release after a body that succeeded: LOCK_LOST, not tied
 * to the body; after a failed body: OK (the body's error stands; a warning is logged). Lost
 * while a failed body ran: LOCK_LOST to report with the body's error. Released in the body:
 * OK. */
static void test_end_scope(void) {
  ferrolock_manager *m = manager_with(options_ms("ttl", (uint64_t)1500, NULL));
  ferrolock_lock *lock = NULL;
  bool with_body = true;
  EXPECT(ferrolock_manager_acquire(m, fresh_key("scope-ok"), NULL, NULL, &lock, &err), FERROLOCK_OK, NULL);
  EXPECT(ferrolock_lock_end_scope(lock, false, &with_body, &err), FERROLOCK_OK, NULL);
  for (int n = 0; n < node_count; n++) CHECK(keys_on(n, "scope-ok") == 0, "node %d: not released", n);
  ferrolock_lock_free(lock);
  for (int failed = 0; failed < 2; failed++) {
    const char *k = fresh_key(failed ? "scope-gone-failed" : "scope-gone");
    EXPECT(ferrolock_manager_acquire(m, k, NULL, NULL, &lock, &err), FERROLOCK_OK, NULL);
    for (int n = 0; n < node_count; n++) {
      char args[256];
      snprintf(args, sizeof args, "DEL '%s'", k);
      CHECK(redis_int(n, args) == 1, "node %d: the key to delete was not there", n);
    }
    if (failed) {
      EXPECT(ferrolock_lock_end_scope(lock, true, &with_body, &err), FERROLOCK_OK, NULL);
    } else {
      EXPECT(ferrolock_lock_end_scope(lock, false, &with_body, &err), FERROLOCK_ERR_LOCK_LOST, "no longer held");
      CHECK(!with_body);
    }
    ferrolock_lock_free(lock);
  }
  EXPECT(ferrolock_manager_acquire(m, fresh_key("scope-lost"), NULL, NULL, &lock, &err), FERROLOCK_OK, NULL);
  pause_majority(1);
  double give_up = now_ms() + 20000;
  while (!ferrolock_lock_is_lost(lock) && now_ms() < give_up) sleep_ms(10);
  pause_majority(0);
  CHECK(ferrolock_lock_is_lost(lock), "never lost");
  EXPECT(ferrolock_lock_end_scope(lock, true, &with_body, &err), FERROLOCK_ERR_LOCK_LOST, "lost");
  CHECK(with_body, "a loss during a failed body is reported with the body's error");
  ferrolock_lock_free(lock);
  EXPECT(ferrolock_manager_acquire(m, fresh_key("scope-elsewhere"), NULL, NULL, &lock, &err), FERROLOCK_OK, NULL);
  EXPECT(ferrolock_lock_release(lock, NULL, &err), FERROLOCK_OK, NULL);
  EXPECT(ferrolock_lock_end_scope(lock, false, &with_body, &err), FERROLOCK_OK, NULL);
  ferrolock_lock_free(lock);
  ferrolock_manager_free(m);
}

/* A child forked while a parent thread waits in an acquire: that wait (its thread was not
 * copied) never ends in the child, which must not wait for it at exit or at a manager's free.
 * Before, the child's shutdown waited a third of its limit and its manager_free 5 s. */
typedef struct {
  ferrolock_manager *m;
  const char *key;
  int got;
} fork_waiter_t;

static void *blocked_acquire(void *arg) {
  fork_waiter_t *w = arg;
  ferrolock_lock *l = NULL;
  if (ferrolock_manager_acquire(w->m, w->key, NULL, NULL, &l, NULL) == FERROLOCK_OK) {
    ferrolock_lock_release(l, NULL, NULL);
    ferrolock_lock_free(l);
    __atomic_store_n(&w->got, 1, __ATOMIC_SEQ_CST);
  }
  return NULL;
}

static void test_fork_while_a_thread_waits(void) {
  ferrolock_manager *m = manager_with(options_ms(NULL));
  char key[128];
  snprintf(key, sizeof key, "%s", fresh_key("fork-waiting"));
  ferrolock_lock *held = NULL;
  EXPECT(ferrolock_manager_acquire(m, key, NULL, NULL, &held, &err), FERROLOCK_OK, NULL);
  fork_waiter_t w = {m, key, 0};
  pthread_t t;
  CHECK(pthread_create(&t, NULL, blocked_acquire, &w) == 0);
  /* Waiting for certain: its place is in the key's queue. */
  double give_up = now_ms() + 20000;
  while (queue_keys_on(0, key) == 0 && now_ms() < give_up) sleep_ms(10);
  CHECK(queue_keys_on(0, key) > 0, "the second acquire never queued");
  fflush(stdout);
  pid_t child = fork();
  CHECK(child >= 0);
  if (child == 0) {
    /* A third of 60 s if the parent's wait counted here; well under that otherwise. */
    double t0 = now_ms();
    ferrolock_shutdown(60000);
    ferrolock_manager_free(m);
    _exit(now_ms() - t0 < 15000 ? 0 : 3);
  }
  int status = child_status(child, 90);
  CHECK(status == 0, "child status %d (3: waited for the parent's acquire; -1: hung or crashed)", status);
  EXPECT(ferrolock_lock_release(held, NULL, &err), FERROLOCK_OK, NULL);
  ferrolock_lock_free(held);
  pthread_join(t, NULL);
  CHECK(__atomic_load_n(&w.got, __ATOMIC_SEQ_CST), "the parent's waiter never got the lock");
  ferrolock_manager_free(m);
}

/* The child of test_freed_then_shutdown (issue 30 item 6 (b), (c)): a lock whose manager was
 * freed stays usable and shutdown releases it; a lock freed unreleased, then its manager
 * freed, is released before shutdown returns. */
static int freed_child(const char *part) {
  char k[3][160];
  for (int i = 0; i < 3; i++) snprintf(k[i], sizeof k[i], "%s:%d", part, i);
  /* A short ttl, so that renewal shows within the test (a slow run's node timeout needs 10 ×). */
  const char *slow = getenv("FERROLOCK_TEST_NODE_TIMEOUT_MS");
  uint64_t ttl = slow ? 10 * strtoull(slow, NULL, 10) : 2000;
  ferrolock_manager *m = manager_with(options_ms("ttl", ttl, NULL));
  ferrolock_lock *usable = NULL, *kept = NULL, *dropped = NULL;
  if (ferrolock_manager_acquire(m, k[0], NULL, NULL, &usable, &err) != FERROLOCK_OK) return 10;
  if (ferrolock_manager_acquire(m, k[1], NULL, NULL, &kept, &err) != FERROLOCK_OK) return 11;
  ferrolock_manager_free(m);
  /* (b) The header's promise: the locks of a freed manager stay usable. */
  uint64_t validity = 0;
  if (ferrolock_lock_extend(usable, FERROLOCK_SAME_TTL, NULL, &validity, &err) != FERROLOCK_OK || validity == 0) return 12;
  bool released = false;
  if (ferrolock_lock_release(usable, &released, &err) != FERROLOCK_OK || !released) return 13;
  ferrolock_lock_free(usable);
  /* Renewed: still held after more than its ttl. */
  sleep_ms((int)ttl + 1000);
  if (!ferrolock_lock_is_held(kept)) return 16;
  /* (c) Freed unreleased, then its manager freed. */
  ferrolock_manager *m2 = manager_with(options_ms(NULL));
  if (ferrolock_manager_acquire(m2, k[2], NULL, NULL, &dropped, &err) != FERROLOCK_OK) return 14;
  ferrolock_lock_free(dropped);
  ferrolock_manager_free(m2);
  /* `kept` is held, its manager freed: shutdown releases it (the dropped one is counted by
   * the background release its free started, which shutdown waits for). */
  size_t n = ferrolock_shutdown(10000);
  if (!ferrolock_lock_is_held(kept) && n >= 1) {
    ferrolock_lock_free(kept);
    return 0;
  }
  fprintf(stderr, "shutdown released %zu\n", n);
  return 15;
}

static void test_freed_then_shutdown(void) {
  char part[128];
  snprintf(part, sizeof part, "%s", fresh_key("freed-shutdown"));
  pid_t child = fork();
  CHECK(child >= 0);
  if (child == 0) {
    execl(self_path, self_path, "freed", part, (char *)NULL);
    _exit(127);
  }
  int status = child_status(child, 60);
  /* The keys first: :1 is the lock whose manager was freed, :2 the one freed unreleased. */
  long left[3] = {0, 0, 0};
  for (int i = 0; i < 3; i++) {
    char k[160];
    snprintf(k, sizeof k, "%s:%d", part, i);
    for (int n = 0; n < node_count; n++) left[i] += keys_on(n, k);
  }
  CHECK(left[0] == 0 && left[1] == 0 && left[2] == 0, "keys left on the nodes: :0 %ld, :1 %ld, :2 %ld", left[0], left[1], left[2]);
  CHECK(status == 0, "child status %d (-1: hung or crashed)", status);
}

/* The header's macros and the linked library give the same version. Needs no server; the
 * dynamically linked build of this file runs it through the soname's link. */
static void test_version(void) {
  char parts[64];
  snprintf(parts, sizeof parts, "%d.%d.%d", FERROLOCK_VERSION_MAJOR, FERROLOCK_VERSION_MINOR,
           FERROLOCK_VERSION_PATCH);
  CHECK(strcmp(parts, FERROLOCK_VERSION_STRING) == 0, "macros %s, string %s", parts, FERROLOCK_VERSION_STRING);
  const char *linked = ferrolock_version();
  CHECK(linked != NULL && strcmp(linked, FERROLOCK_VERSION_STRING) == 0, "library %s, header %s",
        linked ? linked : "(null)", FERROLOCK_VERSION_STRING);
}

/* ---- connections of idle threads (issue 30 item 10) ---- */

/* Node 0's clients opened after the CLIENT ID `since` (connection ids only grow), the
 * probe's own connection excepted. Counting only those leaves out the connections of earlier
 * tests, which may close at any time: twice a clean-clone CI counted one of them into a
 * baseline of all clients and saw "before: 1, after: 0". */
static long clients_after(long since) {
  char args[256];
  snprintf(args, sizeof args,
           "client list | awk '{ split($1, f, \"=\"); if (f[2] + 0 > %ld && index($0, \"cmd=client|list\") == 0) n++ }"
           " END { print n + 0 }'",
           since);
  return redis_int(0, args);
}

/* Polls until node 0 has no client opened after `since`; the deadline only bounds a failing
 * run. */
static long wait_for_no_clients_after(long since, int deadline_ms) {
  double end = now_ms() + deadline_ms;
  long n;
  while ((n = clients_after(since)) != 0 && now_ms() < end) sleep_ms(50);
  return n;
}

#define IDLE_THREADS 20
typedef struct {
  ferrolock_manager *m;
  int i;
  pthread_barrier_t *gate;
} idle_arg;

/* One call (acquire + release), then idle until the test lets it end. */
static void *call_then_idle(void *p) {
  idle_arg *a = p;
  char key[96];
  snprintf(key, sizeof key, "ffi-test:%d:idle:%d", (int)getpid(), a->i);
  ferrolock_lock *lock = NULL;
  if (ferrolock_manager_try_acquire(a->m, key, NULL, &lock, NULL) == FERROLOCK_OK) {
    ferrolock_lock_release(lock, NULL, NULL);
    ferrolock_lock_free(lock);
  }
  pthread_barrier_wait(a->gate); /* every thread has called in */
  pthread_barrier_wait(a->gate); /* idle until the test is done counting */
  return NULL;
}

/* 20 threads each make a call and stay alive, idle; with the manager freed (or not) every
 * connection node 0 got since the test began must close. */
static void idle_threads(const char *what, int free_manager, int deadline_ms) {
  long since = redis_int(0, "client id");
  CHECK(since > 0, "%s: CLIENT ID on node 0 gave %ld", what, since);
  /* On node 0 alone: a blocking thread's own connections serve single-node managers (a
   * multi-node attempt runs on the shared ones). */
  ferrolock_options *o = options_ms(NULL);
  char url[64];
  snprintf(url, sizeof url, "redis://127.0.0.1:%d", node_ports[0]);
  if (ferrolock_options_set_str(o, "nodes", url, NULL) != FERROLOCK_OK) abort();
  ferrolock_manager *m = manager_with(o);
  pthread_barrier_t gate;
  pthread_barrier_init(&gate, NULL, IDLE_THREADS + 1);
  pthread_t t[IDLE_THREADS];
  idle_arg args[IDLE_THREADS];
  for (int i = 0; i < IDLE_THREADS; i++) {
    args[i] = (idle_arg){m, i, &gate};
    pthread_create(&t[i], NULL, call_then_idle, &args[i]);
  }
  pthread_barrier_wait(&gate);
  long during = clients_after(since);
  CHECK(during >= IDLE_THREADS, "%s: %ld new clients with %d threads", what, during, IDLE_THREADS);
  if (free_manager) ferrolock_manager_free(m);
  long after = wait_for_no_clients_after(since, deadline_ms);
  CHECK(after == 0, "%s: %ld of the threads' clients left (with the threads: %ld)", what, after, during);
  pthread_barrier_wait(&gate);
  for (int i = 0; i < IDLE_THREADS; i++) pthread_join(t[i], NULL);
  pthread_barrier_destroy(&gate);
  if (!free_manager) ferrolock_manager_free(m);
}

/* The manager freed while its threads idle (well within the 60 s idle limit): their
 * connections close at once, not when each thread calls in again. */
static void test_freed_manager_closes_idle_threads_connections(void) {
  idle_threads("manager freed", 1, 30000);
}

/* In a child whose idle limit is 300 ms (FERROLOCK_IDLE_CONNECTION_MS): idle threads'
 * connections close although the threads and the manager live on. */
static int idle_child(void) {
  idle_threads("idle threads", 0, 60000);
  if (check_failed) printf("%s\n", failure);
  return check_failed;
}

static void test_idle_threads_close_their_connections(void) {
  fflush(stdout);
  pid_t child = fork();
  if (child == 0) {
    setenv("FERROLOCK_IDLE_CONNECTION_MS", "300", 1);
    execl(self_path, self_path, "idle", (char *)NULL);
    _exit(127);
  }
  int status = 0;
  waitpid(child, &status, 0);
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the idle child failed (status %d)", status);
}

/* ---- lifetimes of read-write holds and permits (the lock's above, for the other kinds) ---- */

enum { KIND_READ, KIND_WRITE, KIND_PERMIT };
static const char *kind_names[] = {"read", "write", "permit"};
/* The pool of the semaphores below: one permit, so that a held one keeps the next out. */
#define KIND_POOL 1

/* Deletes every key whose name contains `part` on every node (a hold's hash and hold keys). */
static void delete_named(const char *part) {
  char cmd[320];
  for (int i = 0; i < node_count; i++) {
    snprintf(cmd, sizeof cmd, "redis-cli -p %d --scan --pattern '*%s*' | xargs -r redis-cli -p %d DEL > /dev/null",
             node_ports[i], part, node_ports[i]);
    if (system(cmd) != 0) abort();
  }
}

/* The nodes a kind lives on: a semaphore on node 0 alone (one_node), a read-write lock on all. */
static int kind_nodes(int kind) { return kind == KIND_PERMIT ? 1 : node_count; }

/* Takes `kind` of `key` through `m`, waiting as `opts` says (NULL: the manager's wait). */
static int take_kind(ferrolock_manager *m, int kind, const char *key, const ferrolock_options *opts,
                     ferrolock_lock **lock_out, ferrolock_error **e) {
  if (kind == KIND_PERMIT) return ferrolock_manager_semaphore_acquire(m, key, KIND_POOL, 1, opts, NULL, lock_out, e);
  int side = kind == KIND_READ ? FERROLOCK_RW_READ : FERROLOCK_RW_WRITE;
  return ferrolock_manager_rw_acquire(m, key, side, FERROLOCK_NO_OWNER, opts, NULL, lock_out, e);
}

/* `take_kind` tried once. */
static int try_kind(ferrolock_manager *m, int kind, const char *key, ferrolock_lock **lock_out) {
  if (kind == KIND_PERMIT) return ferrolock_manager_semaphore_try_acquire(m, key, KIND_POOL, 1, NULL, lock_out, &err);
  int side = kind == KIND_READ ? FERROLOCK_RW_READ : FERROLOCK_RW_WRITE;
  return ferrolock_manager_rw_try_acquire(m, key, side, NULL, lock_out, &err);
}

/* Nothing of `key` is left on its nodes but the layout's own: for a read-write lock no key at
 * all; for a semaphore its counter (no TTL, by design), back at the full pool. Polls up to
 * `poll_ms` for a release still on its way to a node that did not count, a bound below the
 * ttl of what it looks for, so that a leftover cannot pass by expiring. */
static void nothing_left(int kind, const char *key, const char *what, int poll_ms) {
  char args[256];
  for (int i = 0; i < kind_nodes(kind); i++) {
    long left = -1, want = kind == KIND_PERMIT ? 1 : 0;
    double give_up = now_ms() + poll_ms;
    while ((left = keys_on(i, key)) != want && now_ms() < give_up) sleep_ms(25);
    CHECK(left == want, "%s: node %d: %ld keys named after %s left (want %ld)", what, i, left, key, want);
    if (kind == KIND_PERMIT) {
      snprintf(args, sizeof args, "GET '%s'", key);
      CHECK(redis_int(i, args) == KIND_POOL, "%s: %ld permits free of %d", what, redis_int(i, args), KIND_POOL);
    }
  }
}

/* The ttl of the holds these tests look for leftovers of (a read's longest), and the polling
 * bound of those looks: below it, so a leftover is seen before it could expire. */
#define KIND_TTL_MS 30000
#define KIND_POLL_MS 15000

/* A manager of the nodes `kind` lives on, with the ttl above. */
static ferrolock_manager *kind_manager(int kind) {
  ferrolock_options *o = options_ms("ttl", (uint64_t)KIND_TTL_MS, NULL);
  return manager_with(kind == KIND_PERMIT ? one_node(o) : o);
}

/* One kind's cancel: a completion-based acquire waiting behind `holds` (a hold of the other
 * side, or the pool's permit) is cancelled; then nothing of it is left. */
static void cancel_one_kind(int kind, int holds) {
  ferrolock_manager *holder = kind_manager(kind), *m = kind_manager(kind), *next = kind_manager(kind);
  char key[128];
  snprintf(key, sizeof key, "%s", fresh_key(kind_names[kind]));
  const char *what = kind_names[kind];
  ferrolock_lock *held = NULL, *none = NULL, *taken = NULL;
  EXPECT(take_kind(holder, holds, key, NULL, &held, &err), FERROLOCK_OK, NULL);
  done_t d = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0};
  ferrolock_acquisition *a = NULL;
  if (kind == KIND_PERMIT)
    EXPECT(ferrolock_manager_semaphore_acquire_start(m, key, KIND_POOL, 1, NULL, on_done, &d, &a, &err), FERROLOCK_OK, NULL);
  else
    EXPECT(ferrolock_manager_rw_acquire_start(m, key, kind == KIND_READ ? FERROLOCK_RW_READ : FERROLOCK_RW_WRITE, NULL,
                                              FERROLOCK_NO_OWNER, on_done, &d, &a, &err), FERROLOCK_OK, NULL);
  /* The fault: it waits, queued on every node, behind the holder. */
  for (int i = 0; i < kind_nodes(kind); i++) {
    double give_up = now_ms() + 30000;
    while (queue_keys_on(i, key) < 1 && now_ms() < give_up) sleep_ms(25);
    CHECK(queue_keys_on(i, key) >= 1, "%s: node %d: the waiter never queued", what, i);
  }
  EXPECT(ferrolock_acquisition_result(a, &none, &err), FERROLOCK_PENDING, NULL);
  ferrolock_acquisition_cancel(a);
  CHECK(wait_done(&d, 60) == 1, "%s: done called %d times after the cancel", what, d.calls);
  EXPECT(ferrolock_acquisition_result(a, &none, &err), FERROLOCK_ERR_CANCELLED, NULL);
  CHECK(none == NULL);
  ferrolock_acquisition_free(a);
  /* The header: a CANCELLED outcome is ready only once no queue entry of it is left. */
  for (int i = 0; i < kind_nodes(kind); i++)
    CHECK(queue_keys_on(i, key) == 0, "%s: node %d: %ld queue keys left by the cancelled waiter", what, i, queue_keys_on(i, key));
  CHECK(ferrolock_lock_is_held(held), "%s: the holder lost its hold", what);
  EXPECT(ferrolock_lock_release(held, NULL, &err), FERROLOCK_OK, NULL);
  ferrolock_lock_free(held);
  /* No hold, no queue place: the next taker's first try is granted (a writer for the lock). */
  int next_kind = kind == KIND_PERMIT ? KIND_PERMIT : KIND_WRITE;
  int tried = try_kind(next, next_kind, key, &taken);
  CHECK(tried == FERROLOCK_OK, "%s: the next %s's first try: %s: %s", what, kind_names[next_kind],
        ferrolock_status_name(tried), err && err->message ? err->message : "");
  EXPECT(ferrolock_lock_release(taken, NULL, &err), FERROLOCK_OK, NULL);
  ferrolock_lock_free(taken);
  nothing_left(kind, key, what, KIND_POLL_MS);
  ferrolock_manager_free(holder);
  ferrolock_manager_free(m);
  ferrolock_manager_free(next);
}

/* A started read, write and permit acquire, each waiting behind a holder, cancelled: each
 * completes CANCELLED and leaves no hold, no queue place, no key but the layout's own. */
static void test_rw_semaphore_cancel_start(void) {
  cancel_one_kind(KIND_READ, KIND_WRITE);
  if (check_failed) return;
  cancel_one_kind(KIND_WRITE, KIND_READ);
  if (check_failed) return;
  cancel_one_kind(KIND_PERMIT, KIND_PERMIT);
}

/* A loss callback that takes `kind` of `key` through the manager of the lost hold. */
typedef struct {
  ferrolock_manager *m;
  int kind;
  char key[128];
  int calls, took, held, released;
  char message[256];
} lost_takes_t;

static void lost_takes(void *userdata, const ferrolock_error *reason) {
  (void)reason;
  lost_takes_t *t = userdata;
  /* The ttl of a leftover nothing_left would see before it expires. */
  ferrolock_options *wait = ferrolock_options_new();
  ferrolock_options_set_ms(wait, "wait", 30000, NULL);
  ferrolock_options_set_ms(wait, "ttl", KIND_TTL_MS, NULL);
  ferrolock_lock *got = NULL;
  ferrolock_error *e = NULL;
  int took = take_kind(t->m, t->kind, t->key, wait, &got, &e);
  ferrolock_options_free(wait);
  snprintf(t->message, sizeof t->message, "%s", e && e->message ? e->message : "");
  ferrolock_error_free(e);
  int held = got && ferrolock_lock_is_held(got);
  bool released = false;
  int rc = got ? ferrolock_lock_release(got, &released, NULL) : -2;
  ferrolock_lock_free(got);
  t->took = took;
  t->held = held;
  t->released = rc == FERROLOCK_OK && released;
  __atomic_add_fetch(&t->calls, 1, __ATOMIC_SEQ_CST);
}

/* A hold of `kind` of `key` through `m`, its keys deleted: it is signalled lost, and its
 * callback takes `t`'s kind through `t->m`; afterwards nothing of either is left. */
static void lose_and_take(ferrolock_manager *m, int kind, const char *key, lost_takes_t *t) {
  const char *what = kind_names[kind];
  ferrolock_lock *lock = NULL;
  EXPECT(take_kind(m, kind, key, NULL, &lock, &err), FERROLOCK_OK, NULL);
  EXPECT(ferrolock_lock_on_lost(lock, lost_takes, t, &err), FERROLOCK_OK, NULL);
  delete_named(key);
  double give_up = now_ms() + 60000;
  while (!__atomic_load_n(&t->calls, __ATOMIC_SEQ_CST) && now_ms() < give_up) sleep_ms(10);
  CHECK(__atomic_load_n(&t->calls, __ATOMIC_SEQ_CST) == 1, "%s hold: loss callback called %d times", what, t->calls);
  CHECK(ferrolock_lock_is_lost(lock), "%s hold: not lost", what);
  EXPECT(ferrolock_lock_check(lock, &err), FERROLOCK_ERR_LOCK_LOST, NULL);
  CHECK(t->took == FERROLOCK_OK && t->held && t->released, "%s hold's callback took a %s: %s (held %d, released %d): %s",
        what, kind_names[t->kind], ferrolock_status_name(t->took), t->held, t->released, t->message);
  ferrolock_lock_free(lock);
  nothing_left(kind, key, what, KIND_POLL_MS);
  nothing_left(t->kind, t->key, kind_names[t->kind], KIND_POLL_MS);
}

/* A read hold lost (its keys deleted) takes the write lock of its own key from inside its
 * loss callback, through the same manager; a write hold lost takes a permit likewise. */
static void test_rw_lost_callback_calls_in(void) {
  /* A short ttl for a prompt loss (a slow node timeout needs 10 ×). */
  const char *slow = getenv("FERROLOCK_TEST_NODE_TIMEOUT_MS");
  uint64_t ttl = slow ? 10 * strtoull(slow, NULL, 10) : 1500;
  static lost_takes_t read_lost, write_lost;
  ferrolock_manager *all = manager_with(options_ms("ttl", ttl, NULL));
  read_lost = (lost_takes_t){.m = all, .kind = KIND_WRITE};
  snprintf(read_lost.key, sizeof read_lost.key, "%s", fresh_key("lost-read"));
  lose_and_take(all, KIND_READ, read_lost.key, &read_lost);
  ferrolock_manager_free(all);
  if (check_failed) return;

  ferrolock_manager *one = manager_with(one_node(options_ms("ttl", ttl, NULL)));
  write_lost = (lost_takes_t){.m = one, .kind = KIND_PERMIT};
  snprintf(write_lost.key, sizeof write_lost.key, "%s", fresh_key("lost-write-permit"));
  char key[128];
  snprintf(key, sizeof key, "%s", fresh_key("lost-write"));
  lose_and_take(one, KIND_WRITE, key, &write_lost);
  ferrolock_manager_free(one);
}

/* A hold of each kind, on keys named `part`:read, `part`:write, `part`:permit, through `all`
 * (the read-write lock's nodes) and `one` (the semaphore's). Returns the kind that failed, or -1. */
static int take_each_kind(ferrolock_manager *all, ferrolock_manager *one, const char *part,
                          char keys[3][160], ferrolock_lock *locks[3]) {
  for (int k = 0; k < 3; k++) {
    snprintf(keys[k], sizeof keys[k], "%s:%s", part, kind_names[k]);
    locks[k] = NULL;
    if (take_kind(k == KIND_PERMIT ? one : all, k, keys[k], NULL, &locks[k], &err) != FERROLOCK_OK) return k;
  }
  return -1;
}

/* release_all of a manager gives back its read and write holds, the other's its permit: the
 * counts are the holds still held, nothing is left on the nodes, the handles say NOT_HELD,
 * and the managers still hand out holds. */
static void test_rw_semaphore_release_all(void) {
  ferrolock_manager *all = kind_manager(KIND_READ), *one = kind_manager(KIND_PERMIT);
  char part[128], keys[3][160];
  snprintf(part, sizeof part, "%s", fresh_key("release-all-kinds"));
  ferrolock_lock *locks[3], *reader = NULL;
  int failed = take_each_kind(all, one, part, keys, locks);
  CHECK(failed < 0, "%s: %s", kind_names[failed < 0 ? 0 : failed], err ? err->message : "");
  /* A second reader, released by its holder: not counted. */
  EXPECT(take_kind(all, KIND_READ, keys[KIND_READ], NULL, &reader, &err), FERROLOCK_OK, NULL);
  EXPECT(ferrolock_lock_release(reader, NULL, &err), FERROLOCK_OK, NULL);
  size_t released = 99;
  EXPECT(ferrolock_manager_release_all(all, 10000, &released, &err), FERROLOCK_OK, NULL);
  CHECK(released == 2, "the read-write manager released %zu", released);
  released = 99;
  EXPECT(ferrolock_manager_release_all(one, 10000, &released, &err), FERROLOCK_OK, NULL);
  CHECK(released == 1, "the semaphore's manager released %zu", released);
  for (int k = 0; k < 3; k++) {
    nothing_left(k, keys[k], kind_names[k], KIND_POLL_MS);
    if (check_failed) return;
    CHECK(!ferrolock_lock_is_held(locks[k]), "%s: still held", kind_names[k]);
    bool was_held = true;
    EXPECT(ferrolock_lock_release(locks[k], &was_held, &err), FERROLOCK_OK, NULL);
    CHECK(!was_held, "%s: released again", kind_names[k]);
    ferrolock_lock_free(locks[k]);
  }
  ferrolock_lock_free(reader);
  for (int k = 0; k < 3; k++) {
    ferrolock_lock *again = NULL;
    EXPECT(try_kind(k == KIND_PERMIT ? one : all, k, keys[k], &again), FERROLOCK_OK, NULL);
    EXPECT(ferrolock_lock_release(again, NULL, &err), FERROLOCK_OK, NULL);
    ferrolock_lock_free(again);
  }
  ferrolock_manager_free(all);
  ferrolock_manager_free(one);
}

/* The child of test_rw_semaphore_shutdown: holds each kind, frees the managers, runs the exit
 * protocol, then tries each kind again through new managers. */
static int shutdown_kinds_child(const char *part) {
  ferrolock_manager *all = kind_manager(KIND_READ), *one = kind_manager(KIND_PERMIT);
  char keys[3][160];
  ferrolock_lock *locks[3];
  int failed = take_each_kind(all, one, part, keys, locks);
  if (failed >= 0) {
    fprintf(stderr, "%s: %s\n", kind_names[failed], err ? err->message : "");
    return 10 + failed;
  }
  /* Their managers freed, the holds stay usable, and the exit protocol still releases them. */
  ferrolock_manager_free(all);
  ferrolock_manager_free(one);
  for (int k = 0; k < 3; k++) {
    uint64_t validity = 0;
    if (ferrolock_lock_extend(locks[k], FERROLOCK_SAME_TTL, NULL, &validity, &err) != FERROLOCK_OK || validity == 0) {
      fprintf(stderr, "%s extended after its manager was freed: %s\n", kind_names[k], err ? err->message : "");
      return 20 + k;
    }
  }
  size_t released = ferrolock_shutdown(10000);
  if (released != 3) {
    fprintf(stderr, "shutdown released %zu\n", released);
    return 13;
  }
  all = kind_manager(KIND_READ);
  one = kind_manager(KIND_PERMIT);
  for (int k = 0; k < 3; k++) {
    ferrolock_lock *late = NULL;
    int st = try_kind(k == KIND_PERMIT ? one : all, k, keys[k], &late);
    if (st != FERROLOCK_ERR_NOT_ACQUIRED || !err || !strstr(err->message, "exiting")) {
      fprintf(stderr, "%s after shutdown: %s: %s\n", kind_names[k], ferrolock_status_name(st), err ? err->message : "");
      return 14 + k;
    }
    ferrolock_error_free(err);
    err = NULL;
    ferrolock_lock_free(locks[k]);
  }
  ferrolock_manager_free(all);
  ferrolock_manager_free(one);
  return 0;
}

/* The exit protocol (ferrolock_shutdown) in a process of its own releases a read hold, a
 * write hold and a permit whose managers were freed (they stay usable until then), and
 * refuses each kind afterwards; nothing is left on the nodes. */
static void test_rw_semaphore_shutdown(void) {
  char part[128];
  snprintf(part, sizeof part, "%s", fresh_key("shutdown-kinds"));
  fflush(stdout);
  pid_t child = fork();
  CHECK(child >= 0);
  if (child == 0) {
    execl(self_path, self_path, "shutdown-kinds", part, (char *)NULL);
    _exit(127);
  }
  int status = child_status(child, 60);
  CHECK(status == 0, "child status %d (-1: hung or crashed)", status);
  for (int k = 0; k < 3; k++) {
    char key[160];
    snprintf(key, sizeof key, "%s:%s", part, kind_names[k]);
    nothing_left(k, key, kind_names[k], KIND_POLL_MS);
    if (check_failed) return;
  }
}

/* Freeing a held read, write or permit handle without a release releases it in the background
 * (the header's promise for ferrolock_lock_free), and its loss callback is never called: a
 * waiting writer (a permit taker) from another manager is granted before the freed hold could
 * have expired, and nothing is left on the nodes. */
static void test_rw_semaphore_freed_unreleased(void) {
  ferrolock_manager *all = kind_manager(KIND_READ), *one = kind_manager(KIND_PERMIT);
  ferrolock_manager *all2 = kind_manager(KIND_READ), *one2 = kind_manager(KIND_PERMIT);
  char part[128], keys[3][160];
  snprintf(part, sizeof part, "%s", fresh_key("freed-kinds"));
  ferrolock_lock *locks[3];
  int failed = take_each_kind(all, one, part, keys, locks);
  CHECK(failed < 0, "%s: %s", kind_names[failed < 0 ? 0 : failed], err ? err->message : "");
  seen_t quiet[3];
  for (int k = 0; k < 3; k++) {
    quiet[k] = (seen_t){.mu = PTHREAD_MUTEX_INITIALIZER};
    EXPECT(ferrolock_lock_on_lost(locks[k], on_lost, &quiet[k], &err), FERROLOCK_OK, NULL);
  }
  for (int k = 0; k < 3; k++) ferrolock_lock_free(locks[k]);
  /* Waits that end within the time a hold renewed just before the free has left (ttl minus the
   * ttl/3 between renewals), counted from the free: only a release lets them in. */
  double deadline = now_ms() + KIND_POLL_MS;
  ferrolock_options *wait = ferrolock_options_new();
  for (int k = 0; k < 3; k++) {
    int next_kind = k == KIND_PERMIT ? KIND_PERMIT : KIND_WRITE;
    ferrolock_lock *next = NULL;
    double left = deadline - now_ms();
    EXPECT(ferrolock_options_set_ms(wait, "wait", left > 0 ? (uint64_t)left : 0, &err), FERROLOCK_OK, NULL);
    EXPECT(take_kind(k == KIND_PERMIT ? one2 : all2, next_kind, keys[k], wait, &next, &err), FERROLOCK_OK, NULL);
    EXPECT(ferrolock_lock_release(next, NULL, &err), FERROLOCK_OK, NULL);
    ferrolock_lock_free(next);
    nothing_left(k, keys[k], kind_names[k], KIND_POLL_MS);
    if (check_failed) return;
  }
  ferrolock_options_free(wait);
  for (int k = 0; k < 3; k++) CHECK(quiet[k].calls == 0, "%s: a freed hold's loss callback was called", kind_names[k]);
  ferrolock_manager_free(all);
  ferrolock_manager_free(one);
  ferrolock_manager_free(all2);
  ferrolock_manager_free(one2);
}

static void stop_all_nodes(int on) {
  for (int i = 0; i < node_count; i++) kill(node_pids[i], on ? SIGSTOP : SIGCONT);
}

/* As lost_never_after_free for the lock: a read, write and permit hold freed while its nodes
 * are stopped is never signalled lost, though its loss comes while they stay stopped; a free
 * while the loss callback runs waits for it to finish. */
static void test_rw_semaphore_lost_never_after_free(void) {
  ferrolock_manager *all = manager_with(options_ms("ttl", (uint64_t)1500, NULL));
  ferrolock_manager *one = manager_with(one_node(options_ms("ttl", (uint64_t)1500, NULL)));
  char part[2][128], keys[2][3][160];
  ferrolock_lock *early[3], *late[3];
  for (int i = 0; i < 2; i++) snprintf(part[i], sizeof part[i], "%s", fresh_key(i ? "lost-late" : "lost-early"));
  int failed = take_each_kind(all, one, part[0], keys[0], early);
  CHECK(failed < 0, "%s: %s", kind_names[failed < 0 ? 0 : failed], err ? err->message : "");
  failed = take_each_kind(all, one, part[1], keys[1], late);
  CHECK(failed < 0, "%s: %s", kind_names[failed < 0 ? 0 : failed], err ? err->message : "");
  static seen_t quiet[3], slow[3];
  for (int k = 0; k < 3; k++) {
    quiet[k] = (seen_t){.mu = PTHREAD_MUTEX_INITIALIZER};
    slow[k] = (seen_t){.mu = PTHREAD_MUTEX_INITIALIZER, .sleep_ms = 300};
    EXPECT(ferrolock_lock_on_lost(early[k], on_lost, &quiet[k], &err), FERROLOCK_OK, NULL);
    EXPECT(ferrolock_lock_on_lost(late[k], on_lost, &slow[k], &err), FERROLOCK_OK, NULL);
  }
  /* Stopped nodes: no renewal and no release reach them; every hold's loss is coming. */
  stop_all_nodes(1);
  for (int k = 0; k < 3; k++) ferrolock_lock_free(early[k]);
  int started[3], finished[3];
  for (int k = 0; k < 3; k++) {
    double give_up = now_ms() + 30000;
    while (!seen_started(&slow[k]) && now_ms() < give_up) sleep_ms(5);
    /* The callback is running (it naps 300 ms), or never came: free waits for a running one. */
    ferrolock_lock_free(late[k]);
    pthread_mutex_lock(&slow[k].mu);
    started[k] = slow[k].started;
    finished[k] = slow[k].finished;
    pthread_mutex_unlock(&slow[k].mu);
  }
  sleep_ms(1600); /* past the freed holds' ttl: their loss would have been signalled by now */
  stop_all_nodes(0);
  for (int k = 0; k < 3; k++) {
    CHECK(started[k], "%s: the loss was never signalled", kind_names[k]);
    CHECK(finished[k], "%s: ferrolock_lock_free returned while the loss callback was still running", kind_names[k]);
    pthread_mutex_lock(&quiet[k].mu);
    int calls = quiet[k].calls;
    pthread_mutex_unlock(&quiet[k].mu);
    CHECK(calls == 0, "%s: a freed hold's loss callback was called %d times", kind_names[k], calls);
  }
  /* Once the nodes answer again, the freed holds' background releases (or their ttl) free them. */
  ferrolock_options *wait = ferrolock_options_new();
  EXPECT(ferrolock_options_set_ms(wait, "wait", 30000, &err), FERROLOCK_OK, NULL);
  for (int k = 0; k < 3; k++) {
    ferrolock_lock *next = NULL;
    EXPECT(take_kind(k == KIND_PERMIT ? one : all, k == KIND_PERMIT ? KIND_PERMIT : KIND_WRITE, keys[0][k], wait, &next, &err),
           FERROLOCK_OK, NULL);
    EXPECT(ferrolock_lock_release(next, NULL, &err), FERROLOCK_OK, NULL);
    ferrolock_lock_free(next);
  }
  ferrolock_options_free(wait);
  ferrolock_manager_free(all);
  ferrolock_manager_free(one);
}

/* A done callback of a started write acquire, and of a permit's, calls back in as the lock's
 * does in callbacks_call_back_in: it takes its outcome, extends and releases the hold, tries
 * and waits for locks through the same manager, and frees its acquisition. */
static void test_rw_semaphore_done_calls_back_in(void) {
  int must = (1 << IN_RESULT) | (1 << IN_EXTEND) | (1 << IN_RELEASE) | (1 << IN_TRY_ACQUIRE) | (1 << IN_ACQUIRE) |
             (1 << IN_RELEASE_ACQUIRED);
  char why[1024] = "";
  for (int k = KIND_WRITE; k <= KIND_PERMIT; k++) {
    ferrolock_manager *m = kind_manager(k), *other = kind_manager(k);
    static reentry_t done;
    reentry_init(&done, m, kind_names[k]);
    ferrolock_lock *blocker = NULL;
    EXPECT(ferrolock_manager_acquire(other, done.held_key, NULL, NULL, &blocker, &err), FERROLOCK_OK, NULL);
    char key[128];
    snprintf(key, sizeof key, "%s", fresh_key(k == KIND_PERMIT ? "done-permit" : "done-write"));
    if (k == KIND_PERMIT)
      EXPECT(ferrolock_manager_semaphore_acquire_start(m, key, KIND_POOL, 1, NULL, done_calls_back_in, &done, &done.a, &err),
             FERROLOCK_OK, NULL);
    else
      EXPECT(ferrolock_manager_rw_acquire_start(m, key, FERROLOCK_RW_WRITE, NULL, FERROLOCK_NO_OWNER, done_calls_back_in,
                                                &done, &done.a, &err), FERROLOCK_OK, NULL);
    CHECK(reentry_wait(&done, blocker), "%s: the done callback never finished (started: %d)", kind_names[k], done.started);
    CHECK(reentry_ok(&done, kind_names[k], must, why, sizeof why), "%.700s", why);
    nothing_left(k, key, kind_names[k], KIND_POLL_MS);
    if (check_failed) return;
    ferrolock_manager_free(m);
    ferrolock_manager_free(other);
  }
}

/* Fork: the pool of test_rw_semaphore_fork_child's semaphore, one permit for each process. */
#define FORK_POOL 2

/* The child of test_rw_semaphore_fork_child (forked, no exec): the parent's read hold and
 * permit are inert here, with the fork named; its own are granted and its shutdown releases them. */
static int rw_forked_child(ferrolock_manager *all, ferrolock_manager *one, ferrolock_lock *inherited[2],
                           const char *read_key, const char *sem_name) {
  for (int i = 0; i < 2; i++) {
    ferrolock_error *e = NULL;
    if (ferrolock_lock_is_held(inherited[i])) return 20 + i;
    int st = ferrolock_lock_release(inherited[i], NULL, &e);
    int refused = st == FERROLOCK_ERR_NOT_HELD && e && strstr(e->message, "forked child");
    ferrolock_error_free(e);
    e = NULL;
    if (!refused) return 22 + i;
    st = ferrolock_lock_extend(inherited[i], FERROLOCK_SAME_TTL, NULL, NULL, &e);
    refused = st == FERROLOCK_ERR_NOT_HELD && e && strstr(e->message, "forked child");
    ferrolock_error_free(e);
    if (!refused) return 24 + i;
    ferrolock_lock_free(inherited[i]); /* releases nothing: the parent checks its holds */
  }
  ferrolock_lock *read = NULL, *permit = NULL;
  if (ferrolock_manager_read_acquire(all, read_key, NULL, NULL, &read, NULL) != FERROLOCK_OK) return 30;
  if (ferrolock_manager_semaphore_try_acquire(one, sem_name, FORK_POOL, 1, NULL, &permit, NULL) != FERROLOCK_OK)
    return 31;
  if (!ferrolock_lock_is_held(read) || !ferrolock_lock_is_held(permit)) return 32;
  size_t released = ferrolock_shutdown(10000);
  ferrolock_lock_free(read);
  ferrolock_lock_free(permit);
  ferrolock_manager_free(all);
  ferrolock_manager_free(one);
  return released == 2 ? 0 : 33;
}

/* The permit ids held on the semaphore `name` (node 0). */
static long permits_held(const char *name) {
  char args[256];
  snprintf(args, sizeof args, "ZCARD '{%s}:timeout'", name);
  return redis_int(0, args);
}

/* A child forked while the parent holds a read hold and a permit cannot release them, takes
 * its own, and its exit protocol releases only those; the parent's stay, renewed past their ttl. */
static void test_rw_semaphore_fork_child(void) {
  /* A short ttl: the parent's holds outlive it only by being renewed. */
  uint64_t ttl = 3000;
  ferrolock_manager *all = manager_with(options_ms("ttl", ttl, NULL));
  ferrolock_manager *one = manager_with(one_node(options_ms("ttl", ttl, NULL)));
  char read_key[128], sem_name[128];
  snprintf(read_key, sizeof read_key, "%s", fresh_key("fork-read"));
  snprintf(sem_name, sizeof sem_name, "%s", fresh_key("fork-permit"));
  ferrolock_lock *held[2] = {NULL, NULL};
  EXPECT(ferrolock_manager_read_acquire(all, read_key, NULL, NULL, &held[0], &err), FERROLOCK_OK, NULL);
  EXPECT(ferrolock_manager_semaphore_acquire(one, sem_name, FORK_POOL, 1, NULL, NULL, &held[1], &err), FERROLOCK_OK, NULL);
  /* The parent's read hold on each node: its hash and its hold key (a late node may have none). */
  long before[8], total = 0;
  for (int n = 0; n < node_count; n++) total += before[n] = keys_on(n, read_key);
  CHECK(total >= 2, "the parent's read hold is not visible (%ld keys)", total);
  CHECK(permits_held(sem_name) == 1, "%ld permit ids held", permits_held(sem_name));
  fflush(stdout);
  pid_t child = fork();
  CHECK(child >= 0);
  if (child == 0) _exit(rw_forked_child(all, one, held, read_key, sem_name));
  int status = child_status(child, 60);
  CHECK(status == 0, "child status %d (-1: hung or crashed)", status);
  /* The child's holds were released by its shutdown (no second hold key, one permit id); the
   * parent's are untouched, and renewed: still there after more than their ttl. */
  for (int round = 0; round < 2; round++) {
    for (int n = 0; n < node_count; n++)
      CHECK(keys_on(n, read_key) == before[n], "round %d: node %d: %ld keys of the read lock, %ld before the fork", round,
            n, keys_on(n, read_key), before[n]);
    CHECK(permits_held(sem_name) == 1, "round %d: %ld permit ids held", round, permits_held(sem_name));
    CHECK(ferrolock_lock_is_held(held[0]) && ferrolock_lock_is_held(held[1]), "round %d: the parent's holds: read %d, permit %d",
          round, ferrolock_lock_is_held(held[0]), ferrolock_lock_is_held(held[1]));
    if (round == 0) sleep_ms(2 * (int)ttl);
  }
  for (int i = 0; i < 2; i++) {
    bool released = false;
    EXPECT(ferrolock_lock_release(held[i], &released, &err), FERROLOCK_OK, NULL);
    CHECK(released, "the parent's %s was no longer held on a quorum", i ? "permit" : "read hold");
    ferrolock_lock_free(held[i]);
  }
  ferrolock_manager_free(all);
  ferrolock_manager_free(one);
}

/* A node whose server closed our connections (a restart, its idle `timeout`, CLIENT KILL):
 * the next request is written to a socket whose peer is gone, and the kernel raises SIGPIPE
 * on the writing thread. Its default action ends the process, and a C program keeps it (Python,
 * Node and Rust programs ignore it): the library must get EPIPE, not kill its host. Over a unix
 * socket every such write fails at once (over TCP only a second write after the reset does).
 * Both writers: the caller's thread (its own connection, blocking calls) and the library's
 * (the watchdog's renewals, a completion-based acquire). In a process of its own, with
 * SIGPIPE at its default. Before the fix the child died of SIGPIPE in the first extend. */
static int sigpipe_child(const char *sock) {
  signal(SIGPIPE, SIG_DFL);
  char nodes[300], kill_clients[400];
  snprintf(nodes, sizeof nodes, "unix://%s", sock);
  snprintf(kill_clients, sizeof kill_clients, "redis-cli -s '%s' CLIENT KILL TYPE normal SKIPME yes > /dev/null", sock);
  ferrolock_options *o = ferrolock_options_new();
  if (ferrolock_options_set_str(o, "nodes", nodes, &err) != FERROLOCK_OK) return 10;
  if (ferrolock_options_set_ms(o, "restart_guard", 0, &err) != FERROLOCK_OK) return 10;
  if (ferrolock_options_set_ms(o, "ttl", 1000, &err) != FERROLOCK_OK) return 10;
  ferrolock_manager *m = NULL;
  if (ferrolock_manager_new(o, &m, &err) != FERROLOCK_OK) return 11;
  ferrolock_options_free(o);
  for (int round = 0; round < 5; round++) {
    ferrolock_lock *lock = NULL, *started = NULL;
    if (ferrolock_manager_acquire(m, "sigpipe:caller", NULL, NULL, &lock, &err) != FERROLOCK_OK) return 12;
    ferrolock_acquisition *a = NULL;
    if (ferrolock_manager_acquire_start(m, "sigpipe:library", NULL, FERROLOCK_NO_OWNER, NULL, NULL, &a, &err) != FERROLOCK_OK)
      return 13;
    int st;
    while ((st = ferrolock_acquisition_result(a, &started, &err)) == FERROLOCK_PENDING) sleep_ms(10);
    ferrolock_acquisition_free(a);
    if (st != FERROLOCK_OK) return 14;
    if (system(kill_clients) != 0) return 15;
    /* The caller's connection: each call writes to it (or to its replacement). */
    for (int i = 0; i < 3; i++) {
      ferrolock_lock_extend(lock, FERROLOCK_SAME_TTL, NULL, NULL, NULL);
      sleep_ms(20);
    }
    /* The library's: the watchdog renews both locks every ttl/3 on its own threads. */
    if (system(kill_clients) != 0) return 15;
    sleep_ms(700);
    ferrolock_lock_release(lock, NULL, NULL);
    ferrolock_lock_release(started, NULL, NULL);
    ferrolock_lock_free(lock);
    ferrolock_lock_free(started);
  }
  ferrolock_manager_free(m);
  return 0;
}

static void test_sigpipe_not_raised(void) {
  char dir[] = "/tmp/ferrolock-sigpipe-XXXXXX", cmd[600], sock[128];
  CHECK(mkdtemp(dir) != NULL);
  snprintf(sock, sizeof sock, "%s/redis.sock", dir);
  snprintf(cmd, sizeof cmd,
           "redis-server --port 0 --unixsocket '%s' --save '' --appendonly no --dir '%s' --daemonize yes "
           "--pidfile '%s/redis.pid' --logfile '%s/redis.log' && for i in $(seq 1 200); do "
           "redis-cli -s '%s' ping > /dev/null 2>&1 && exit 0; sleep 0.05; done; exit 1",
           sock, dir, dir, dir, sock);
  CHECK(system(cmd) == 0, "cannot start a redis-server on %s", sock);
  pid_t child = fork();
  if (child == 0) {
    execl(self_path, self_path, "sigpipe", sock, (char *)NULL);
    _exit(127);
  }
  int status = 0;
  double give_up = now_ms() + 120000;
  pid_t got;
  while (child > 0 && (got = waitpid(child, &status, WNOHANG)) == 0 && now_ms() < give_up) sleep_ms(20);
  if (child > 0 && got == 0) {
    kill(child, SIGKILL);
    waitpid(child, &status, 0);
  }
  snprintf(cmd, sizeof cmd, "redis-cli -s '%s' shutdown nosave > /dev/null 2>&1; rm -rf '%s'", sock, dir);
  if (system(cmd) != 0) { /* the server is gone either way */
  }
  CHECK(child > 0);
  CHECK(!WIFSIGNALED(status), "the process was killed by signal %d (%s)", WTERMSIG(status), strsignal(WTERMSIG(status)));
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child status %d", WEXITSTATUS(status));
}

static const test_t tests[] = {
    {"acquire_release", test_acquire_release},
    {"exclusion_and_reentry", test_exclusion_and_reentry},
    {"extend", test_extend},
    {"two_processes", test_two_processes},
    {"lost_before_validity_ends", test_lost_before_validity_ends},
    {"lost_never_after_free", test_lost_never_after_free},
    {"lost_callback_releases_its_lock_during_free", test_lost_callback_releases_its_lock_during_free},
    {"loss_callbacks_releasing_each_other", test_loss_callbacks_releasing_each_other},
    {"fork_while_a_thread_waits", test_fork_while_a_thread_waits},
    {"end_scope", test_end_scope},
    {"cancel_blocked_acquire", test_cancel_blocked_acquire},
    {"completion_acquire", test_completion_acquire},
    {"manager_free_ends_waits", test_manager_free_ends_waits},
    {"manager_close_ends_stuck_calls", test_manager_close_ends_stuck_calls},
    {"manager_close_from_callbacks", test_manager_close_from_callbacks},
    {"calls_on_a_closed_manager", test_calls_on_a_closed_manager},
    {"callbacks_call_back_in", test_callbacks_call_back_in},
    {"done_after_out_slot", test_done_after_out_slot},
    {"cancel_completion_acquire_as_granted", test_cancel_completion_acquire_as_granted},
    {"bad_inputs", test_bad_inputs},
    {"long_key_messages", test_long_key_messages},
    {"metrics_text", test_metrics_text},
    {"log_callback", test_log_callback},
    {"free_collected", test_free_collected},
    {"release_all", test_release_all},
    {"shutdown", test_shutdown},
    {"fork_child", test_fork_child},
    {"fork_during_done", test_fork_during_done},
    {"freed_then_shutdown", test_freed_then_shutdown},
    {"version", test_version},
    {"read_write", test_read_write},
    {"semaphore", test_semaphore},
    {"rw_semaphore_cancel_start", test_rw_semaphore_cancel_start},
    {"rw_lost_callback_calls_in", test_rw_lost_callback_calls_in},
    {"rw_semaphore_release_all", test_rw_semaphore_release_all},
    {"rw_semaphore_shutdown", test_rw_semaphore_shutdown},
    {"rw_semaphore_fork_child", test_rw_semaphore_fork_child},
    {"rw_semaphore_freed_unreleased", test_rw_semaphore_freed_unreleased},
    {"rw_semaphore_lost_never_after_free", test_rw_semaphore_lost_never_after_free},
    {"rw_semaphore_done_calls_back_in", test_rw_semaphore_done_calls_back_in},
    {"freed_manager_closes_idle_threads_connections", test_freed_manager_closes_idle_threads_connections},
    {"idle_threads_close_their_connections", test_idle_threads_close_their_connections},
    {"sigpipe_not_raised", test_sigpipe_not_raised},
};

static int selected(const char *only, const char *name) {
  if (!only) return 1;
  size_t n = strlen(name);
  for (const char *p = only; (p = strstr(p, name)); p += n)
    if ((p == only || p[-1] == ',') && (p[n] == '\0' || p[n] == ',')) return 1;
  return 0;
}

int main(int argc, char **argv) {
  self_path = argv[0];
  if (argc == 4 && strcmp(argv[1], "hold") == 0) return hold(argv[2], atoi(argv[3]));
  if (argc == 2 && strcmp(argv[1], "idle") == 0) {
    read_nodes();
    return idle_child();
  }
  if (argc == 3 && strcmp(argv[1], "shutdown") == 0) {
    read_nodes();
    return shutdown_child(argv[2]);
  }
  if (argc == 3 && strcmp(argv[1], "sigpipe") == 0) return sigpipe_child(argv[2]);
  if (argc == 3 && strcmp(argv[1], "freed") == 0) {
    read_nodes();
    return freed_child(argv[2]);
  }
  if (argc == 3 && strcmp(argv[1], "shutdown-kinds") == 0) {
    read_nodes();
    return shutdown_kinds_child(argv[2]);
  }
  const char *only = argc == 3 && strcmp(argv[1], "--only") == 0 ? argv[2] : NULL;
  const char *except = argc == 3 && strcmp(argv[1], "--except") == 0 ? argv[2] : NULL;
  read_nodes();
  int passed = 0, failed = 0;
  for (size_t i = 0; i < sizeof tests / sizeof tests[0]; i++) {
    if (!selected(only, tests[i].name)) continue;
    if (except && selected(except, tests[i].name)) {
      printf("skip %s (--except: not run here, not counted)\n", tests[i].name);
      continue;
    }
    check_failed = 0;
    failure[0] = '\0';
    double t0 = now_ms();
    tests[i].run();
    if (check_failed) {
      failed++;
      printf("FAIL %s: %s\n", tests[i].name, failure);
    } else {
      passed++;
      printf("ok   %s (%.0f ms)\n", tests[i].name, now_ms() - t0);
    }
    fflush(stdout);
  }
  printf("%d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}

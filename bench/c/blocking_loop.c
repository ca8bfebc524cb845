/* `make bench`, C part (issue 16): blocking acquire + release of one key in a loop through
 * the C library, the way a C caller would write it (ferrolock_manager_acquire, then
 * ferrolock_lock_release and ferrolock_lock_free). Its baseline is the same loop in Rust over
 * the core's blocking path (bench/examples/blocking_loop.rs), with the same options, run by
 * bench/go in the same run on the same redis-servers.
 *
 *   blocking_loop NODES SECONDS KEY
 * NODES: comma-separated redis:// URLs. Prints one JSON line: {"ops":…,"seconds":…,"p50":…,
 * "p99":…} (latencies in µs, after a warm-up of 200 operations). */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "ferrolock.h"

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static int fail(const char *what, int status, ferrolock_error *err) {
  fprintf(stderr, "blocking_loop: %s: %s: %s\n", what, ferrolock_status_name(status),
          err ? err->message : "(no message)");
  ferrolock_error_free(err);
  return 1;
}

static int by_value(const void *a, const void *b) {
  float x = *(const float *)a, y = *(const float *)b;
  return (x > y) - (x < y);
}

/* One acquire + release; its latency in µs into *lat. */
static int once(const ferrolock_manager *m, const char *key, float *lat) {
  ferrolock_error *err = NULL;
  ferrolock_lock *lock = NULL;
  double t = now_us();
  int status = ferrolock_manager_acquire(m, key, NULL, NULL, &lock, &err);
  if (status != FERROLOCK_OK) return fail("acquire", status, err);
  bool released = false;
  status = ferrolock_lock_release(lock, &released, &err);
  ferrolock_lock_free(lock);
  if (status != FERROLOCK_OK) return fail("release", status, err);
  if (!released) return fail("release", FERROLOCK_ERR_NOT_HELD, NULL);
  *lat = (float)(now_us() - t);
  return 0;
}

int main(int argc, char **argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: blocking_loop NODES SECONDS KEY\n");
    return 2;
  }
  double seconds = atof(argv[2]);
  if (!(seconds > 0)) {
    fprintf(stderr, "blocking_loop: SECONDS %s: must be a positive number\n", argv[2]);
    return 2;
  }
  ferrolock_error *err = NULL;
  ferrolock_options *opts = ferrolock_options_new();
  int status = ferrolock_options_set_str(opts, "nodes", argv[1], &err);
  if (status == FERROLOCK_OK) status = ferrolock_options_set_ms(opts, "ttl", 10000, &err);
  /* Fresh servers: the guard would hold back the votes of the first ttl (as in the baseline). */
  if (status == FERROLOCK_OK) status = ferrolock_options_set_ms(opts, "restart_guard", 0, &err);
  if (status != FERROLOCK_OK) return fail("options", status, err);
  ferrolock_manager *m = NULL;
  status = ferrolock_manager_new(opts, &m, &err);
  ferrolock_options_free(opts);
  if (status != FERROLOCK_OK) return fail("manager", status, err);

  size_t cap = 1 << 16, n = 0;
  float *lat = malloc(cap * sizeof *lat);
  if (!lat) return 1;
  for (int i = 0; i < 200; i++)
    if (once(m, argv[3], &lat[0])) return 1;
  double start = now_us(), end = start + seconds * 1e6, t = start;
  while (t < end) {
    if (n == cap) {
      float *more = realloc(lat, 2 * cap * sizeof *lat);
      if (!more) return 1;
      lat = more;
      cap *= 2;
    }
    if (once(m, argv[3], &lat[n])) return 1;
    n++;
    t = now_us();
  }
  qsort(lat, n, sizeof *lat, by_value);
  printf("{\"ops\":%zu,\"seconds\":%.6f,\"p50\":%.1f,\"p99\":%.1f}\n", n, (t - start) / 1e6,
         lat[n / 2], lat[n * 99 / 100]);
  free(lat);
  ferrolock_manager_free(m);
  return 0;
}

/* Takes a lock on the nodes in FERROLOCK_NODES, works under it, releases it.
 *   cc hello_lock.c $(pkg-config --cflags --libs ferrolock) -o hello_lock */
#include <stdio.h>

#include "ferrolock.h"

static int fail(const char *what, ferrolock_error *err) {
  fprintf(stderr, "%s: %s: %s\n", what, ferrolock_status_name(err->code), err->message);
  ferrolock_error_free(err);
  return 1;
}

int main(void) {
  ferrolock_error *err = NULL;
  ferrolock_options *opts = ferrolock_options_new(); /* nodes: FERROLOCK_NODES */
  ferrolock_options_set_ms(opts, "ttl", 5000, NULL);
  ferrolock_options_set_ms(opts, "wait", 10000, NULL); /* or FERROLOCK_WAIT_FOREVER */
  ferrolock_manager *manager = NULL;
  int status = ferrolock_manager_new(opts, &manager, &err);
  ferrolock_options_free(opts);
  if (status != FERROLOCK_OK) return fail("manager", err);

  ferrolock_lock *lock = NULL;
  if (ferrolock_manager_acquire(manager, "orders:1001", NULL, NULL, &lock, &err) != FERROLOCK_OK) {
    ferrolock_manager_free(manager);
    return fail("acquire", err);
  }
  printf("holding %s for %llu ms (renewed while held)\n", ferrolock_lock_key(lock),
         (unsigned long long)ferrolock_lock_validity_ms(lock));
  /* ... the critical section ... */
  bool released = false;
  status = ferrolock_lock_release(lock, &released, &err);
  ferrolock_lock_free(lock);
  ferrolock_manager_free(manager);
  if (status != FERROLOCK_OK) return fail("release", err);
  printf("released: %s\n", released ? "yes" : "it had expired");
  return 0;
}

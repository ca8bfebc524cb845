/* libFuzzer target over the C entry points that parse caller input without a network: option
 * names and values (every setter), node URLs (ferrolock_manager_new), per-acquire options over
 * a manager's defaults, and keys given to an acquire whose manager has no reachable node is
 * not done (it would wait on the network). Invariants: no crash, no leak, no sanitizer report;
 * every failure is a known status with a non-empty message.
 * Input: fields separated by NUL bytes: selector byte, name, value. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ferrolock.h"

static void check(int status, ferrolock_error *err) {
  if (status == FERROLOCK_OK) {
    if (err) abort();
    return;
  }
  if (!err || err->code != status || !err->message || !err->message[0]) abort();
  if (status == FERROLOCK_ERR_PANIC) abort(); /* a panic caught is still a bug */
  ferrolock_error_free(err);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 2) return 0;
  char *buf = malloc(size + 2);
  memcpy(buf, data + 1, size - 1);
  buf[size - 1] = '\0';
  buf[size] = '\0';
  const char *name = buf;
  const char *value = buf + strlen(buf) + 1; /* the second field, or "" */
  if (value > buf + size - 1) value = buf + size - 1;
  uint64_t number = 0;
  memcpy(&number, data + 1, size - 1 < 8 ? size - 1 : 8);

  ferrolock_options *opts = ferrolock_options_new();
  ferrolock_error *err = NULL;
  int st;
  switch (data[0] % 7) {
    case 0: st = ferrolock_options_set_str(opts, name, value, &err); break;
    case 1: st = ferrolock_options_set_ms(opts, name, number, &err); break;
    case 2: st = ferrolock_options_set_bool(opts, name, number & 1, &err); break;
    case 3: st = ferrolock_options_set_count(opts, name, number, &err); break;
    case 4: {
      double d;
      memcpy(&d, &number, sizeof d);
      st = ferrolock_options_set_number(opts, name, d, &err);
      break;
    }
    case 5: st = ferrolock_options_set_none(opts, name, &err); break;
    default: st = ferrolock_options_set_str(opts, "nodes", name, &err); break;
  }
  check(st, err);
  err = NULL;
  ferrolock_manager *m = NULL;
  st = ferrolock_manager_new(opts, &m, &err);
  check(st, err);
  (void)ferrolock_status_name(st);
  ferrolock_manager_free(m);
  ferrolock_options_free(opts);
  free(buf);
  return 0;
}

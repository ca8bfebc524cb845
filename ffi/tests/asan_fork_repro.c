/* Why fork_child is left out of `make test-c-sanitize` (issue 30), shown without ferrolock:
 * a child forked while other threads create and end threads, which then starts a thread of its
 * own. Built with GCC 12's AddressSanitizer, some children hang for good; built plainly, none
 * (`make asan-fork-repro` builds and runs both). The hung child's new thread waits on a mutex
 * of ASan's allocator (SizeClassAllocator64::GetFromAllocator, reached from AsanThread::Init's
 * calloc) that another thread of the parent held at the fork: this libasan has no fork
 * interceptor that takes its allocator's locks around fork() (glibc's own malloc does, through
 * its atfork handlers). Upstream: google/sanitizers#774. fork_child's child does the same: it
 * starts the runtime threads of its own manager while the parent's library threads run.
 * Exit status: 0 when no child hung, 1 otherwise. */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static void *nothing(void *arg) { return arg; }

static void *spawner(void *arg) {
  (void)arg;
  for (;;) {
    pthread_t t;
    if (pthread_create(&t, NULL, nothing, NULL) == 0) pthread_join(t, NULL);
  }
  return NULL;
}

int main(int argc, char **argv) {
  int forks = argc > 1 ? atoi(argv[1]) : 300, hangs = 0;
  pthread_t s[2];
  for (int i = 0; i < 2; i++) pthread_create(&s[i], NULL, spawner, NULL);
  for (int i = 0; i < forks; i++) {
    pid_t c = fork();
    if (c < 0) return 2;
    if (c == 0) {
      pthread_t t;
      if (pthread_create(&t, NULL, nothing, NULL) == 0) pthread_join(t, NULL);
      _exit(0);
    }
    /* A child that has not exited after 5 s is stuck (it needs microseconds). */
    struct timespec ms = {0, 1000000};
    int st = 0, waited = 0;
    while (waitpid(c, &st, WNOHANG) == 0) {
      nanosleep(&ms, NULL);
      if (++waited == 5000) {
        hangs++;
        kill(c, SIGKILL);
        waitpid(c, &st, 0);
        break;
      }
    }
  }
  printf("%d forks, %d children hung\n", forks, hangs);
  return hangs ? 1 : 0;
}

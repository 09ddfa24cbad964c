/*
 * pthread_cancel of a thread that is inside the library: a thread loads a
 * .params file from a FIFO and waits in the library's read for the data when
 * it is cancelled. glibc acts on a cancellation request at a cancellation
 * point (read, open, sleeps) by unwinding the thread, which may not cross
 * the library's Rust frames: the process aborted ("FATAL: exception not
 * rethrown"). The library now keeps cancellation off while it works (and
 * on, as the caller had it, in callbacks): the load completes, and the
 * request is acted on at the thread's next cancellation point in its own
 * code.
 *
 * Built and run by `make ctest` (also ctest-asan, ctest-valgrind).
 */
#include "check.h"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

static char fifo[256];
static int load_rc = -2;
/* (globals, not locals of the cancelled thread: ASan misreports the stack of
   a thread ended by cancellation when its frames held poisoned locals) */
static uint32_t loaded, loaded_names;
static NDArrayHandle *arrs;
static const char **names;
static NDArrayHandle first;

static void *loader(void *arg) {
  (void)arg;
  load_rc = MXNDArrayLoad(fifo, &loaded, &arrs, &loaded_names, &names);
  if (load_rc == 0 && loaded == 1) first = arrs[0];
  pthread_testcancel(); /* the request is acted on here */
  return NULL;
}

int main(void) {
  alarm(60);
  char dir[] = "/tmp/mxkv_cancel_XXXXXX";
  CHECK(mkdtemp(dir) != NULL);
  char file[300];
  snprintf(file, sizeof file, "%s/a.params", dir);
  snprintf(fifo, sizeof fifo, "%s/fifo", dir);

  /* the bytes of a valid file */
  NDArrayHandle a = make_f32(3, (float[]){1.5f, 2.5f, 3.5f});
  const char *name = "w";
  CHECK_OK(MXNDArraySave(file, 1, &a, &name));
  CHECK_OK(MXNDArrayFree(a));
  FILE *f = fopen(file, "rb");
  CHECK(f != NULL);
  static unsigned char bytes[4096];
  size_t len = fread(bytes, 1, sizeof bytes, f);
  fclose(f);
  CHECK(len > 0 && len < sizeof bytes);

  CHECK(mkfifo(fifo, 0600) == 0);
  pthread_t t;
  CHECK(pthread_create(&t, NULL, loader, NULL) == 0);
  /* returns once the loader has opened the FIFO: it reads (or is about to) */
  int fd = open(fifo, O_WRONLY);
  CHECK(fd >= 0);
  CHECK(pthread_cancel(t) == 0);
  CHECK(write(fd, bytes, len) == (ssize_t)len);
  CHECK(close(fd) == 0);
  void *ret = NULL;
  CHECK(pthread_join(t, &ret) == 0);
  CHECK(ret == PTHREAD_CANCELED);
  CHECK(load_rc == 0);
  CHECK(loaded == 1);
  CHECK_F32(first, 3, 1.5f, 2.5f, 3.5f);
  CHECK_OK(MXNDArrayFree(first));

  unlink(fifo);
  unlink(file);
  rmdir(dir);
  printf("test_cancel: OK\n");
  return 0;
}

// Calls the C callbacks a user hands to the C API (updaters, the server
// controller) inside try/catch: a C++ callback that throws must not unwind
// into the Rust library (Rust aborts the process on a foreign exception).
// Each trampoline returns 0 when the callback returned, 1 when it threw a
// std::exception (its what() copied, truncated and NUL-terminated, into
// err[0..err_len)), 2 when it threw anything else. A thread's forced unwind
// (pthread_cancel, pthread_exit) is not an error and is rethrown.
#include <cstddef>
#include <cstring>
#include <cxxabi.h>
#include <exception>

namespace {

typedef void (*int_updater)(int, void *, void *, void *);
typedef void (*str_updater)(const char *, void *, void *, void *);
typedef void (*controller)(int, const char *, void *);

void copy_what(const std::exception &e, char *err, size_t err_len) {
  if (err == nullptr || err_len == 0) return;
  const char *w = e.what();
  if (w == nullptr) w = "";
  size_t n = std::strlen(w);
  if (n >= err_len) n = err_len - 1;
  std::memcpy(err, w, n);
  err[n] = '\0';
}

template <typename F>
int guarded(F f, char *err, size_t err_len) {
  try {
    f();
    return 0;
  } catch (abi::__forced_unwind &) {
    throw;
  } catch (const std::exception &e) {
    copy_what(e, err, err_len);
    return 1;
  } catch (...) {
    return 2;
  }
}

}  // namespace

extern "C" int mxkv_guarded_int_updater(int_updater f, int key, void *recv, void *local,
                                        void *user, char *err, size_t err_len) {
  return guarded([&] { f(key, recv, local, user); }, err, err_len);
}

extern "C" int mxkv_guarded_str_updater(str_updater f, const char *key, void *recv, void *local,
                                        void *user, char *err, size_t err_len) {
  return guarded([&] { f(key, recv, local, user); }, err, err_len);
}

extern "C" int mxkv_guarded_controller(controller f, int head, const char *body, void *user,
                                       char *err, size_t err_len) {
  return guarded([&] { f(head, body, user); }, err, err_len);
}

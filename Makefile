# libmxkv — build, tutorial, tests. `make` builds the library and runs the
# tutorial; `make test` runs everything CI runs. Both set up what they need
# (Python venv, pip packages, apt packages) on a fresh machine.

CARGO   ?= cargo
PYTHON  ?= python3
VENV    := .venv
PY      := $(VENV)/bin/python
LIBDIR  := build/lib
SO      := target/release/libmxkv.so
# The C tests are written for gcc (-fsanitize, valgrind suppressions): make's built-in
# default CC (cc) is replaced by gcc, a CC given on the command line or in the
# environment is kept (`CC ?= gcc` did nothing: make always defines CC).
ifeq ($(origin CC),default)
CC      := gcc
endif
CFLAGS_TEST := -std=c11 -Wall -Wextra -Wpedantic -Werror -D_GNU_SOURCE -Iinclude -g -O1
CXXFLAGS_TEST := -std=c++17 -Wall -Wextra -Wpedantic -Werror -Iinclude -g -O1
LDLIBS_TEST := -L$(LIBDIR) -lmxkv -Wl,-rpath,$(abspath $(LIBDIR)) -lpthread
ASAN    := -fsanitize=address,undefined -fno-omit-frame-pointer
CTESTS  := $(patsubst ctests/%.c,%,$(wildcard ctests/test_*.c)) \
           $(patsubst ctests/%.cc,%,$(wildcard ctests/test_*.cc))
# MXNet 1.9.1 from the reference venv (found without importing it).
MXDIR    = $(shell $(PY) -c "import importlib.util,os;print(os.path.dirname(importlib.util.find_spec('mxnet').origin))")

.PHONY: all build tutorial venv venv-ref tools standalone header lint cargo-test ctest ctest-asan \
        ctest-valgrind ctest-dist abi diff pytest pytest-numpy2 test bench clean

all: tutorial

## The library: target/release/libmxkv.{so,a}, staged in build/lib with its soname.
# Each file is written under a temporary name in $(LIBDIR), then renamed over the old one:
# a process that has the old library mapped (a test running during a rebuild) keeps it
# intact (cp -f over it rewrote its pages in place under that process).
build:
	$(CARGO) build --release
	@mkdir -p $(LIBDIR)
	t=$(LIBDIR)/.libmxkv.so.0.$$$$; cp -f $(SO) $$t && mv -f $$t $(LIBDIR)/libmxkv.so.0 || { rm -f $$t; exit 1; }
	t=$(LIBDIR)/.libmxkv.so.$$$$; ln -sfn libmxkv.so.0 $$t && mv -fT $$t $(LIBDIR)/libmxkv.so || { rm -f $$t; exit 1; }
	t=$(LIBDIR)/.libmxkv.a.$$$$; cp -f target/release/libmxkv.a $$t && mv -f $$t $(LIBDIR)/libmxkv.a || { rm -f $$t; exit 1; }

## The KVStore tutorial in Python (`import mxkv as mx`), then in C.
tutorial: build venv
	PYTHONPATH=bindings/python $(PY) examples/tutorial.py
	@mkdir -p build/examples
	$(CC) -std=c11 -Wall -Wextra -Werror -Iinclude examples/tutorial.c -o build/examples/tutorial $(LDLIBS_TEST)
	./build/examples/tutorial

## Python venv: numpy for the binding; MXNet 1.9.1 and pytest as the test oracle.
$(VENV)/.base:
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q numpy==1.23.5
	touch $@
$(VENV)/.ref: $(VENV)/.base
	$(PY) -m pip install -q mxnet==1.9.1 numpy==1.23.5 pytest
	touch $@
venv: $(VENV)/.base
venv-ref: $(VENV)/.ref

## System tools the tests use.
tools:
	@missing=""; command -v valgrind >/dev/null || missing="$$missing valgrind"; \
	  command -v pkg-config >/dev/null || missing="$$missing pkgconf"; \
	  command -v g++ >/dev/null || missing="$$missing g++"; \
	  if [ -n "$$missing" ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; fi

## Regenerate include/mxkv/c_api.h from src/capi (commit the result).
header:
	MXKV_BLESS=1 $(CARGO) test --release --test header

lint:
	$(CARGO) fmt --check
	$(CARGO) clippy --release --all-targets -- -D warnings

## The repository stands on its own: no tracked file (Markdown notes aside)
## refers to the steering folder that sits beside a developer's checkout.
standalone:
	@if git grep -nE '[.][.]/shared' -- . ':!*.md'; then \
	  echo "standalone: the files above refer to the shared folder beside a checkout, which a clone does not have"; exit 1; fi
	@echo "standalone: no tracked file refers to the shared folder beside the checkout"

## Rust unit tests, and the check that the committed header is current.
cargo-test:
	$(CARGO) test --release

build/ctests/%: ctests/%.c ctests/check.h build
	@mkdir -p build/ctests
	$(CC) $(CFLAGS_TEST) $< -o $@ $(LDLIBS_TEST)
build/ctests-asan/%: ctests/%.c ctests/check.h build
	@mkdir -p build/ctests-asan
	$(CC) $(CFLAGS_TEST) $(ASAN) $< -o $@ $(LDLIBS_TEST)
# C++ tests (callbacks that throw), with g++
build/ctests/%: ctests/%.cc build
	@mkdir -p build/ctests
	$(CXX) $(CXXFLAGS_TEST) $< -o $@ $(LDLIBS_TEST)
build/ctests-asan/%: ctests/%.cc build
	@mkdir -p build/ctests-asan
	$(CXX) $(CXXFLAGS_TEST) $(ASAN) $< -o $@ $(LDLIBS_TEST)

ctest: $(addprefix build/ctests/,$(CTESTS))
	@set -e; for t in $(CTESTS); do echo "== $$t"; ./build/ctests/$$t; done
# (a stack switch ASan was not told about makes it stop checking: a failure)
ctest-asan: $(addprefix build/ctests-asan/,$(CTESTS))
	@set -e; for t in $(CTESTS); do echo "== $$t (ASan/UBSan)"; \
	  ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 ./build/ctests-asan/$$t \
	    2> build/ctests-asan/$$t.stderr || { cat build/ctests-asan/$$t.stderr; exit 1; }; \
	  cat build/ctests-asan/$$t.stderr >&2; \
	  if grep -q 'False positive error reports may follow' build/ctests-asan/$$t.stderr; then \
	    echo "$$t: ASan lost track of the stack (a stack switch it was not told about)"; exit 1; fi; done
ctest-valgrind: tools $(addprefix build/ctests/,$(CTESTS))
	@set -e; for t in $(CTESTS); do echo "== $$t (valgrind)"; \
	  valgrind -q --fair-sched=yes --error-exitcode=1 --leak-check=full --show-leak-kinds=definite,indirect --errors-for-leak-kinds=definite,indirect ./build/ctests/$$t; done

## A C program through the C API on dist clusters on 127.0.0.1 (every node runs it; 2 workers,
## 1 scheduler, 1 or 2 servers; int and string keys), started by mxkv_launch.py under `timeout`.
build/ctests-dist/dist_worker: ctests/dist/dist_worker.c ctests/check.h build
	@mkdir -p build/ctests-dist
	$(CC) $(CFLAGS_TEST) $< -o $@ $(LDLIBS_TEST)
build/ctests-dist/fork_worker: ctests/dist/fork_worker.c ctests/check.h build
	@mkdir -p build/ctests-dist
	$(CC) $(CFLAGS_TEST) $< -o $@ $(LDLIBS_TEST)
ctest-dist: build/ctests-dist/dist_worker build/ctests-dist/fork_worker
	@set -e; for keys in int str; do for s in 1 2; do \
	  echo "== dist_worker ($$keys keys, 2 workers, $$s servers)"; \
	  MXNET_KVSTORE_BIGARRAY_BOUND=20 MXKV_TIMEOUT_S=60 timeout -k 10 150 $(PYTHON) \
	    bindings/python/mxkv_launch.py -n 2 -s $$s --timeout 120 -- \
	    ./build/ctests-dist/dist_worker $$keys > build/ctests-dist/log 2>&1 \
	    || { cat build/ctests-dist/log; exit 1; }; \
	  cat build/ctests-dist/log; test "$$(grep -c 'DIST C OK' build/ctests-dist/log)" = 2; \
	done; done
	@echo "== fork_worker (a forked child frees its parent's dist store)"; \
	  MXKV_TIMEOUT_S=60 timeout -k 10 150 $(PYTHON) bindings/python/mxkv_launch.py -n 2 -s 1 --timeout 120 -- \
	    ./build/ctests-dist/fork_worker > build/ctests-dist/log 2>&1 || { cat build/ctests-dist/log; exit 1; }; \
	  cat build/ctests-dist/log; test "$$(grep -c 'DIST FORK OK' build/ctests-dist/log)" = 2

## ABI: MXNet 1.9.1's own c_api.h and ours in one translation unit, -Werror.
abi: venv-ref
	@mkdir -p build
	$(CC) -std=c11 -Wall -Wextra -Werror -I$(MXDIR)/include -Iinclude -c ctests/conformance.c -o build/conformance.o
	@echo "abi: MXNet 1.9.1's c_api.h and include/mxkv/c_api.h agree"

## Differential: the same C scenario against libmxnet.so and libmxkv.so.
diff: venv-ref build
	@mkdir -p build/diff
	$(CC) -std=c11 -Wall -Wextra -Werror -O1 ctests/diff/scenario.c -o build/diff/scenario -ldl
	SCENARIO_TMP=build/diff ./build/diff/scenario $(MXDIR)/libmxnet.so > build/diff/mxnet.txt 2>build/diff/mxnet.err
	SCENARIO_TMP=build/diff ./build/diff/scenario $(abspath $(SO)) > build/diff/mxkv.txt
	$(PYTHON) ctests/diff/compare.py build/diff/mxnet.txt build/diff/mxkv.txt ctests/diff/deviations.txt

pytest: venv-ref build
	@if [ -d tests/python ]; then $(PY) -m pytest -q tests/python; else echo "no Python tests yet"; fi

## The optimizer suites under numpy 2, which a user installing the wheel gets (MXNet 1.9.1
## needs numpy < 1.24): mxkv in a second venv, MXNet from the reference venv in
## subprocesses (the in-process differential tests skip there). numpy pinned (the newest
## release when this was written) so that a new numpy release cannot change CI.
VENV2 := build/venv-numpy2
NUMPY2_TESTS := $(addprefix tests/python/,test_optimizer_ref_venv.py test_optimizer_libm.py \
        test_optimizer_pickle.py test_optimizer_pickle_numpy.py test_optimizer_pickle_shapes.py \
        test_optimizer_states_mxnet.py test_optimizer_fidelity.py)
$(VENV2)/.base:
	$(PYTHON) -m venv $(VENV2)
	$(VENV2)/bin/python -m pip install -q numpy==2.4.6 pytest
	touch $@
pytest-numpy2: venv-ref build $(VENV2)/.base
	PYTHONPATH=bindings/python MXKV_LIBRARY_PATH=$(abspath $(SO)) \
	  $(VENV2)/bin/python -m pytest -q -p no:cacheprovider $(NUMPY2_TESTS)

test: venv-ref tools standalone lint cargo-test ctest ctest-asan ctest-valgrind ctest-dist abi diff pytest pytest-numpy2 bench-smoke bench-dist-smoke install-check
	@echo "make test: all suites passed"

include bench/bench.mk
include mk/install.mk
-include mk/wheel.mk

clean:
	$(CARGO) clean
	rm -rf build

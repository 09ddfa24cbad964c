# bench/bench.mk — benchmarks of libmxkv against MXNet 1.9.1 (issue 4; issue 5 item 3).
# Included from the top-level Makefile, which provides PY (venv python), CC, SO
# (target/release/libmxkv.so), MXDIR (the mxnet package directory) and the
# targets `build` and `venv-ref`.
#
#   make bench        full run (< 10 min on 2 cores): bench/results/<date>.{csv,md,png},
#                     prints the Markdown table; exits 1 if any pulled value was wrong
#   make bench-smoke  one small size of every figure, both libraries, values checked
#                     (< 60 s); also checks that a wrong value is caught

BENCH_BIN    := build/bench/kvbench
BENCH_OUT    := build/bench
BENCH_RES    := bench/results
BENCH_CFLAGS := -std=gnu11 -O3 -Wall -Wextra -Werror
BENCH_MXNET   = $(MXDIR)/libmxnet.so
BENCH_MXKV    = $(abspath $(SO))
BENCH_PYENV   = MXKV_LIBRARY_PATH=$(BENCH_MXKV) PYTHONPATH=bindings/python
# matplotlib (for the chart) goes into the reference venv, numpy kept at the pinned version
BENCH_MPL    := $(patsubst %/bin/,%,$(dir $(PY)))/.bench-mpl

.PHONY: bench bench-smoke

$(BENCH_BIN): bench/kvbench.c
	@mkdir -p $(@D)
	$(CC) $(BENCH_CFLAGS) $< -o $@ -ldl -lpthread -lm

$(BENCH_MPL): | venv-ref
	$(PY) -m pip install -q matplotlib==3.10.9 numpy==1.23.5
	touch $@

bench: build venv-ref $(BENCH_BIN) $(BENCH_MPL)
	@mkdir -p $(BENCH_OUT) $(BENCH_RES)
	@start=$$(date +%s); rc=0; \
	./$(BENCH_BIN) --csv $(BENCH_OUT)/c.csv $(BENCH_MXNET) $(BENCH_MXKV) || rc=1; \
	$(BENCH_PYENV) $(PY) bench/pybench.py --csv $(BENCH_OUT)/py.csv || rc=1; \
	$(PY) bench/report.py --c $(BENCH_OUT)/c.csv --py $(BENCH_OUT)/py.csv \
	  --out-dir $(BENCH_RES) --elapsed $$(( $$(date +%s) - start )) || rc=1; \
	exit $$rc

bench-smoke: build venv-ref $(BENCH_BIN)
	@mkdir -p $(BENCH_OUT)/smoke
	./$(BENCH_BIN) --smoke --csv $(BENCH_OUT)/smoke/c.csv $(BENCH_MXNET) $(BENCH_MXKV)
	$(BENCH_PYENV) $(PY) bench/pybench.py --smoke --csv $(BENCH_OUT)/smoke/py.csv
	$(PY) bench/report.py --c $(BENCH_OUT)/smoke/c.csv --py $(BENCH_OUT)/smoke/py.csv \
	  --out-dir $(BENCH_OUT)/smoke --date smoke --no-png --quiet
	@# the value checks must catch a wrong value (exit status 1, not a load error)
	@KVBENCH_CORRUPT=1 ./$(BENCH_BIN) --smoke --only pull --csv /dev/null \
	  $(BENCH_MXNET) $(BENCH_MXKV) 2>/dev/null; \
	  test $$? -eq 1 || { echo "bench-smoke: kvbench did not catch a wrong value"; exit 1; }
	@KVBENCH_CORRUPT=1 $(BENCH_PYENV) $(PY) bench/pybench.py --smoke --csv /dev/null \
	  2>/dev/null; \
	  test $$? -eq 1 || { echo "bench-smoke: pybench did not catch a wrong value"; exit 1; }
	@echo "bench-smoke: both libraries ran every figure with correct values"

# --- distributed store (issue 10, item 5) ---------------------------------------------------
#   make bench-dist        MXNet 1.9.1 and libmxkv dist_sync clusters (1+1, 2+2) on 127.0.0.1,
#                          started with bindings/python/mxkv_launch.py, beside the loopback TCP
#                          limit and libzmq echoes (examples/zmq_echo.rs) measured in the same
#                          run (~3 min): bench/results/<date>-dist.
#                          {csv,md,png}; prints the Markdown; exits 1 if a pulled value was
#                          wrong or a job failed. libmxkv's rows are n/a (with the reason)
#                          while its distributed store does not pass bench/dist's probe job.
#   make bench-dist-smoke  4 MiB values, one repetition, values checked (< 60 s); libmxkv
#                          included as soon as its probe job passes; also checks that a wrong
#                          value is caught
DIST_OUT := build/bench/dist

.PHONY: bench-dist bench-dist-smoke

bench-dist: build venv-ref $(BENCH_MPL)
	@mkdir -p $(DIST_OUT) $(BENCH_RES)
	$(CARGO) build --release --example zmq_echo
	@start=$$(date +%s); rc=0; \
	$(BENCH_PYENV) $(PY) bench/dist/distbench.py --csv $(DIST_OUT)/dist.csv \
	  --raw $(DIST_OUT)/dist.jsonl || rc=1; \
	$(PY) bench/dist/report.py --csv $(DIST_OUT)/dist.csv --out-dir $(BENCH_RES) \
	  --elapsed $$(( $$(date +%s) - start )) || rc=1; \
	exit $$rc

bench-dist-smoke: build venv-ref
	@mkdir -p $(DIST_OUT)/smoke
	$(CARGO) build --release --example zmq_echo
	$(BENCH_PYENV) $(PY) bench/dist/distbench.py --smoke --csv $(DIST_OUT)/smoke/dist.csv \
	  --raw $(DIST_OUT)/smoke/dist.jsonl
	$(PY) bench/dist/report.py --csv $(DIST_OUT)/smoke/dist.csv --out-dir $(DIST_OUT)/smoke \
	  --date smoke --no-png --quiet
	@# the value checks must catch a wrong value (exit status 1, not a failed job)
	@KVBENCH_CORRUPT=1 $(BENCH_PYENV) $(PY) bench/dist/distbench.py --smoke --no-loopback \
	  --libs mxnet --configs 1x1 --csv /dev/null 2>/dev/null; \
	  test $$? -eq 1 || { echo "bench-dist-smoke: distbench did not catch a wrong value"; exit 1; }
	@echo "bench-dist-smoke: every cluster ran every figure with correct values;" \
	  "libmxkv dist_sync: $$(sed -n 's/^dist,meta,mxkv_dist,.*,ok,"\(.\{0,90\}\).*/\1/p' \
	  $(DIST_OUT)/smoke/dist.csv)"

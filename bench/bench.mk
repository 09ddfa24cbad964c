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

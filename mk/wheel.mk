# The Python wheel (`include mk/wheel.mk` from the Makefile; uses its $(PY), $(VENV), $(CARGO)).
# The build compiles libmxkv with cargo through setuptools-rust, into build/wheel-target
# (never target/), and ships it as mxkv/libmxkv.so in a py3-none-<platform> wheel;
# see bindings/python/README.md. tests/python/test_wheel.py does the work.

WHEEL_DIR := build/wheel

.PHONY: wheel wheel-check

## The platform wheel, mxkv-<version>-py3-none-<platform>.whl, in build/wheel/ (tag and
## contents checked: the library, every module, the mxkv-launch entry point).
wheel: $(VENV)/.base
	CARGO=$(CARGO) $(PY) tests/python/test_wheel.py build --out $(WHEEL_DIR)

## The wheel above, installed into a fresh venv (no system site-packages) in a temporary
## folder; examples/tutorial.py copied there runs with no MXKV_LIBRARY_PATH or PYTHONPATH
## and prints what MXNet 1.9.1 prints; its mxkv-launch runs a 2-worker, 1-server dist_sync job.
wheel-check: $(VENV)/.ref
	CARGO=$(CARGO) $(PY) tests/python/test_wheel.py check --out $(WHEEL_DIR)

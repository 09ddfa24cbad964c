"""``mxkv.launch``: the cluster launcher, ``mxkv-launch`` (see ``mxkv_launch``).

The launcher lives in the top-level module ``mxkv_launch`` so that the
``mxkv-launch`` command imports neither numpy nor libmxkv (importing the
``mxkv`` package loads both); this module re-exports it for
``python -m mxkv.launch`` and ``from mxkv import launch``.
"""
from mxkv_launch import *  # noqa: F401,F403
from mxkv_launch import main

if __name__ == '__main__':
    raise SystemExit(main())

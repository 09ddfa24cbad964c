"""Every prototype of the generated C header has a ctypes declaration in mxkv._lib
with the same number and kinds of arguments."""
import ctypes
import os
import re

import pytest

from conftest import REPO

HEADER = os.environ.get('MXKV_HEADER', os.path.join(REPO, 'include', 'mxkv', 'c_api.h'))

_PROTO = re.compile(r'\b(?:MXNET_DLL\s+|MXKV_API\s+|extern\s+)*'
                    r'((?:const\s+)?[A-Za-z_][\w\s\*]*?)\s*\**\s*\b(MX\w+)\s*\(([^;{]*?)\)\s*;',
                    re.S)


def _strip_comments(text):
    text = re.sub(r'/\*.*?\*/', ' ', text, flags=re.S)
    text = re.sub(r'//[^\n]*', ' ', text)
    return re.sub(r'^\s*#[^\n]*', ' ', text, flags=re.M)


def parse_header(text):
    """name -> list of parameter declarations (strings)"""
    protos = {}
    for m in _PROTO.finditer(_strip_comments(text)):
        name, params = m.group(2), ' '.join(m.group(3).split())
        if params in ('', 'void'):
            args = []
        else:
            args = [p.strip() for p in params.split(',')]
        protos[name] = args
    return protos


def _kind(decl):
    """coarse C kind of a parameter declaration: pointer depth + base class"""
    decl = re.sub(r'\bDEFAULT\([^)]*\)', '', decl)
    depth = decl.count('*')
    if re.search(r'\(\s*\*', decl) or re.search(r'(Updater|Controller)\b', decl):
        return ('fn', 0)
    if re.search(r'\b(NDArrayHandle|KVStoreHandle|void)\b', decl) and depth == 0 \
            and 'void' not in decl:
        return ('handle', 0)
    if re.search(r'\b(NDArrayHandle|KVStoreHandle)\b', decl):
        return ('handle', depth)
    if 'char' in decl:
        return ('char', depth)
    if 'void' in decl:
        return ('void', depth)
    if re.search(r'\bbool\b', decl):
        return ('bool', depth)
    if re.search(r'(int64_t|size_t|uint64_t)', decl):
        return ('int64', depth)
    return ('int32', depth)


def _ctypes_kind(t):
    depth = 0
    while hasattr(t, '_type_') and issubclass(t, ctypes._Pointer):
        depth += 1
        t = t._type_
    if t is ctypes.c_void_p:
        return ('handle', depth)
    if t is ctypes.c_char_p:
        return ('char', depth + 1)
    if hasattr(t, '_flags_') and hasattr(t, '_argtypes_'):
        return ('fn', 0)
    if t is ctypes.c_bool:
        return ('bool', depth)
    if ctypes.sizeof(t) == 8:
        return ('int64', depth)
    return ('int32', depth)


def _compatible(c_kind, py_kind):
    if c_kind == py_kind:
        return True
    # void* data / void* handle: both c_void_p
    if c_kind[0] in ('void', 'handle') and py_kind[0] == 'handle':
        return c_kind[1] == py_kind[1] + (1 if c_kind[0] == 'void' else 0) or \
            c_kind[1] == py_kind[1]
    return False


@pytest.fixture(scope='module')
def header_protos():
    if not os.path.isfile(HEADER):
        pytest.skip('generated header %s does not exist yet (cbindgen output of the Rust '
                    'library); this test runs as soon as it is generated' % HEADER)
    with open(HEADER) as fin:
        protos = parse_header(fin.read())
    assert protos, 'no MX* prototypes found in %s' % HEADER
    return protos


def test_every_header_prototype_is_declared(header_protos):
    from mxkv._lib import PROTOTYPES
    missing = sorted(set(header_protos) - set(PROTOTYPES))
    assert not missing, 'prototypes in the header without a declaration in mxkv/_lib.py: %s' \
        % missing


def test_declarations_match_header(header_protos):
    from mxkv._lib import PROTOTYPES
    problems = []
    for name, (_, argtypes) in PROTOTYPES.items():
        if name not in header_protos:
            continue
        cargs = header_protos[name]
        if len(cargs) != len(argtypes):
            problems.append('%s: header has %d args, binding %d' % (name, len(cargs), len(argtypes)))
            continue
        for i, (c, p) in enumerate(zip(cargs, argtypes)):
            ck, pk = _kind(c), _ctypes_kind(p)
            if not _compatible(ck, pk):
                problems.append('%s arg %d: header %r (%s) vs binding %s (%s)'
                                % (name, i, c, ck, p.__name__, pk))
    assert not problems, '\n'.join(problems)


def test_parser_on_mxnet_style_text():
    text = '''
    /*! doc */
    MXNET_DLL int MXKVStorePush(KVStoreHandle handle, mx_uint num, const int* keys,
                                NDArrayHandle* vals, int priority);
    MXNET_DLL const char *MXGetLastError();
    int MXKVStoreGetNumDeadNode(KVStoreHandle handle, const int node_id, int *number,
                                const int timeout_sec DEFAULT(60));
    '''
    protos = parse_header(text)
    assert protos['MXKVStorePush'][2] == 'const int* keys'
    assert protos['MXGetLastError'] == []
    assert len(protos['MXKVStoreGetNumDeadNode']) == 4

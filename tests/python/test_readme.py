"""The ```python blocks of the READMEs run as pasted, in the order printed.

All blocks of one README run in one namespace, one after the other, as a
reader pasting them into one interpreter session would.  An expression
statement whose line ends in a comment that reads as a value (``x.asnumpy()
# array([ 7, 42])``) must print as that comment says.
"""
import ast
import contextlib
import io
import os
import re
import tokenize

import pytest

from conftest import BINDINGS, REPO

READMES = [os.path.join(BINDINGS, 'README.md'), os.path.join(REPO, 'README.md')]
_BLOCK = re.compile(r'^```python[ \t]*\n(.*?)^```', re.S | re.M)


def python_blocks(path):
    """[(first line number, source)] of the ```python blocks of a Markdown file."""
    with open(path) as fin:
        text = fin.read()
    return [(text.count('\n', 0, m.start(1)) + 1, m.group(1)) for m in _BLOCK.finditer(text)]


def _value_comments(source):
    """{line: comment text} for comments that read as a value (a literal or a call)."""
    out = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type != tokenize.COMMENT:
            continue
        text = tok.string[1:].strip()
        try:
            expr = ast.parse(text, mode='eval').body
        except SyntaxError:
            continue
        if not isinstance(expr, (ast.Name, ast.Attribute)):
            out[tok.start[0]] = text
    return out


def run_blocks(path, namespace, cwd):
    """Run every block of `path` in `namespace`; return how many value comments were checked."""
    checked = 0
    here = os.getcwd()
    os.chdir(str(cwd))
    try:
        for first, source in python_blocks(path):
            where = '%s, block at line %d' % (os.path.relpath(path, REPO), first)
            tree = ast.parse(source, where)
            comments = _value_comments(source)
            for stmt in tree.body:
                expected = comments.get(stmt.end_lineno)
                if isinstance(stmt, ast.Expr) and expected is not None:
                    value = eval(compile(ast.Expression(stmt.value), where, 'eval'), namespace)
                    if value is not None:
                        assert repr(value) == expected, \
                            '%s, line %d: %r, the README says %s' % (
                                where, first + stmt.lineno - 1, value, expected)
                        checked += 1
                    continue
                exec(compile(ast.Module([stmt], type_ignores=[]), where, 'exec'), namespace)
    finally:
        os.chdir(here)
    return checked


def test_python_blocks_of_the_readmes_run_in_order(mxkv, tmp_path):
    blocks = {path: python_blocks(path) for path in READMES}
    assert len(blocks[READMES[0]]) >= 3, 'bindings/python/README.md lost its examples'
    assert 'import mxkv as mx' in blocks[READMES[0]][0][1]
    checked = 0
    for path in READMES:
        namespace = {'__name__': '__readme__'}
        stdout = io.StringIO()
        with contextlib.redirect_stdout(stdout):
            checked += run_blocks(path, namespace, tmp_path)
    # the row_sparse example states its result: that line must have been compared
    assert checked >= 1


def test_a_failing_block_is_reported(mxkv, tmp_path):
    readme = tmp_path / 'README.md'
    readme.write_text('x\n```python\nimport mxkv as mx\nkv = mx.kv.create("local")\n'
                      'kv.init(3, mx.nd.ones((2,)))\n```\n\n```python\n'
                      'kv.init("emb", mx.nd.ones((2,)))\n```\n')
    with pytest.raises(Exception, match='Mixed key types'):
        run_blocks(str(readme), {}, tmp_path)


def test_a_wrong_stated_value_is_reported(mxkv, tmp_path):
    readme = tmp_path / 'README.md'
    readme.write_text('```python\nimport mxkv as mx\n'
                      'mx.nd.array([1, 2]).asnumpy()   # array([1., 3.], dtype=float32)\n```\n')
    with pytest.raises(AssertionError, match='the README says'):
        run_blocks(str(readme), {}, tmp_path)

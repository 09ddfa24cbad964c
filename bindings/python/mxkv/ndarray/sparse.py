"""Sparse NDArray classes.  Row-sparse support arrives with libmxkv's row_sparse
store; until then these wrap handles the library returns and convert nothing."""
from ..base import MXNetError
from .ndarray import NDArray

__all__ = ['RowSparseNDArray', 'CSRNDArray', 'BaseSparseNDArray', 'zeros']


class BaseSparseNDArray(NDArray):
    """Common base of the sparse arrays."""
    __slots__ = []

    def __repr__(self):
        shape_info = 'x'.join(['%d' % x for x in self.shape])
        return '\n<%s %s @%s>' % (self.__class__.__name__, shape_info, self.context)

    def _view(self, write=False):
        raise MXNetError('%s has no dense buffer view in mxkv' % self.__class__.__name__)


class RowSparseNDArray(BaseSparseNDArray):
    """row_sparse array (handle wrapper)."""
    __slots__ = []


class CSRNDArray(BaseSparseNDArray):
    """csr array (handle wrapper)."""
    __slots__ = []


def zeros(stype, shape, ctx=None, dtype=None, **kwargs):  # pylint: disable=unused-argument
    """Sparse zeros: not available in this version of mxkv."""
    raise MXNetError('sparse arrays (%s) are not supported by mxkv yet' % stype)

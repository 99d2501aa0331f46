# Types for the one part of numba's API that Aryl uses (numba ships no types and typeshed has no stubs).
#
# `njit` compiles a function into a dispatcher that is called exactly like the function, with arguments of
# the types the function was written for; so, to the type checker, it returns the function's own type.
# That is the honest part to check: the kernels' argument and return types at every call. What it hides
# (the dispatcher's own attributes such as `py_func`) is unused here; declare it before using it.

from collections.abc import Callable
from typing import Any, TypeVar, overload

_F = TypeVar("_F", bound=Callable[..., Any])

@overload
def njit(func: _F, /) -> _F: ...
@overload
def njit(
    *,
    cache: bool = ...,
    parallel: bool = ...,
    fastmath: bool = ...,
    boundscheck: bool | None = ...,
    nogil: bool = ...,
    error_model: str = ...,
) -> Callable[[_F], _F]: ...

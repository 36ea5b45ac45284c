"""``pallas.einshape``: equations become split / transpose / merge transforms."""

import jax.numpy as jnp
import numpy as np
import pytest

from pallas import einshape as es


@pytest.mark.parametrize("equation, shape, sizes, ops", [
    ("ab->ba", (2, 3), {}, [es.Transpose((1, 0))]),
    ("abc->abc", (2, 3, 4), {}, []),
    ("abcd->ab(cd)", (2, 3, 4, 5), {}, [es.MergeDims(2, 2)]),
    ("a(bc)->abc", (10, 12), {"b": 3}, [es.SplitDims(1, (3, 4))]),
    ("(ab)c->(ba)c", (6, 5), {"a": 2},
     [es.SplitDims(0, (2, 3)), es.Transpose((1, 0, 2)), es.MergeDims(0, 2)]),
    ("(ab)(cd)->(ac)(bd)", (6, 20), {"a": 2, "c": 4},
     [es.SplitDims(0, (2, 3)), es.SplitDims(2, (4, 5)), es.Transpose((0, 2, 1, 3)),
      es.MergeDims(0, 2), es.MergeDims(1, 2)]),
])
def test_an_equation_becomes_transforms_whose_indices_follow_the_running_shape(
        equation, shape, sizes, ops):
    assert es.get_einshape_transforms(equation, shape, **sizes) == ops


def test_einshape_applies_the_transforms_like_reshape_and_transpose():
    x = jnp.arange(6 * 20).reshape(6, 20)
    y = es.einshape("(ab)(cd)->(ac)(bd)", x, a=2, c=4)
    want = np.asarray(x).reshape(2, 3, 4, 5).transpose(0, 2, 1, 3).reshape(8, 15)
    np.testing.assert_array_equal(y, want)


@pytest.mark.parametrize("equation, shape, sizes, message", [
    ("a(bc)->abc", (10, 12), {}, r"Ambiguous split for \['b', 'c'\] with size 12"),
    ("a(bc)->abc", (10, 13), {"b": 3}, "Cannot split size 13 with known sizes 3"),
    ("a(bc)->abc", (10, 12), {"b": 3, "c": 5}, "Size mismatch for group"),
    ("ab->ba", (2, 3, 4), {}, "LHS has 2 groups but input has 3 dims"),
    ("ab->ac", (2, 3), {}, r"same dimensions; \['c'\]"),
    ("a(b->ab", (2, 3), {}, "Unmatched parenthesis"),
    ("ab", (2, 3), {}, "exactly one '->'"),
])
def test_bad_equations_are_value_errors_naming_the_equation(equation, shape, sizes, message):
    with pytest.raises(ValueError, match=message):
        es.get_einshape_transforms(equation, shape, **sizes)

"""distspawn.TestCase: upstream's assertEqual semantics, seeding, run_tests."""

import random

import numpy as np
import pytest
import torch

from distspawn import TestCase


class _Case(TestCase):
    def runTest(self):
        pass


@pytest.fixture
def case():
    return _Case()


@pytest.mark.parametrize("x, y", [
    (torch.tensor([3]), 3),
    (3, torch.tensor([3.0])),
    (torch.tensor(3.0), 3),
    (True, 1),
    (1, 1.0),
    (torch.tensor([1, 2]), [1, 2]),
    ([1, 2], (1, 2)),
    ({"a": torch.ones(2)}, {"a": torch.ones(2)}),
    (float("nan"), float("nan")),
    (torch.tensor([float("nan")]), torch.tensor([float("nan")])),
    ("text", "text"),
    (None, None),
    (torch.tensor([1.0]), 1.0000001),
    (np.array([1.0, 2.0]), torch.tensor([1.0, 2.0], dtype=torch.float64)),
    (1 + 2j, torch.tensor([1 + 2j])),
])
def test_equal_like_upstream(case, x, y):
    case.assertEqual(x, y)


@pytest.mark.parametrize("x, y, words", [
    (torch.ones(2), torch.ones(2, dtype=torch.float64), "dtype"),
    (torch.tensor([3]), 3.5, "not close"),
    (torch.tensor([1, 2]), 2, "cannot compare a number with a tensor of 2 elements"),
    ([1, 2], [1, 2, 3], "lengths differ: 2 != 3"),
    ({"a": 1}, {"b": 1}, "keys differ"),
    ([torch.ones(1), torch.zeros(1)], [torch.ones(1), torch.ones(1)], "[1]"),
    (1, 2, "scalars are not equal: 1 != 2"),
    ("a", "b", "'a' != 'b'"),
])
def test_unequal_like_upstream(case, x, y, words):
    with pytest.raises(AssertionError, match=None) as info:
        case.assertEqual(x, y)
    assert words in str(info.value)


def test_tolerances_and_flags(case):
    case.assertEqual(torch.tensor([1.0]), torch.tensor([1.1]), atol=0.2, rtol=0)
    with pytest.raises(AssertionError):
        case.assertEqual(torch.tensor([1.0]), torch.tensor([1.1]), atol=0.01, rtol=0)
    case.assertEqual(torch.ones(2), torch.ones(2, dtype=torch.float64), exact_dtype=False)
    with pytest.raises(AssertionError):
        case.assertEqual(float("nan"), float("nan"), equal_nan=False)
    with pytest.raises(ValueError, match="both atol and rtol"):
        case.assertEqual(1.0, 1.0, atol=1e-3)


class _MixingTensor(torch.Tensor):
    """Takes part in ops with tensors of other types, as LocalTensor and funcol's
    AsyncCollectiveTensor do."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        return super().__torch_function__(func, (torch.Tensor,), args, kwargs or {})


class _LeftTensor(_MixingTensor):
    pass


class _RightTensor(_MixingTensor):
    pass


def test_tensors_of_unrelated_subclasses_compare_by_value(case):
    # Neither type is the other's subclass, so torch.testing.assert_close
    # refuses the pair; upstream's assertEqual compares it (a LocalTensor
    # against an AsyncCollectiveTensor in pytorch's test_parallelize_api.py).
    def left(*values, **kwargs):
        return torch.tensor(values, **kwargs).as_subclass(_LeftTensor)

    def right(*values, **kwargs):
        return torch.tensor(values, **kwargs).as_subclass(_RightTensor)

    case.assertEqual(left(1.0, 2.0), right(1.0, 2.0))
    for y, words in [(right(1.0, 2.5), "not close"), (right(1.0), "shape"),
                     (right(1.0, 2.0, dtype=torch.float64), "dtype")]:
        with pytest.raises(AssertionError) as info:
            case.assertEqual(left(1.0, 2.0), y)
        assert words in str(info.value)
    case.assertEqual(left(1.0, 2.0), right(1.0, 2.0, dtype=torch.float64), exact_dtype=False)


def test_msg_is_appended_and_callable_msg_rewrites(case):
    with pytest.raises(AssertionError, match="(?s)not equal.*my note"):
        case.assertEqual(1, 2, "my note")
    with pytest.raises(AssertionError, match="^rewritten: "):
        case.assertEqual(1, 2, msg=lambda generated: "rewritten: " + generated)


def test_assert_not_equal(case):
    case.assertNotEqual(torch.ones(2), torch.zeros(2))
    with pytest.raises(AssertionError, match="expected them to differ"):
        case.assertNotEqual(torch.ones(2), [1.0, 1.0])


def test_setup_seeds_torch_random_and_numpy(case):
    case.setUp()
    first = (torch.rand(1).item(), random.random(), np.random.rand())
    case.setUp()
    assert (torch.rand(1).item(), random.random(), np.random.rand()) == first

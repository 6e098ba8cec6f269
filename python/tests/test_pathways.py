import pathlib
import subprocess
import sys

import numpy as np
import pytest

import pathways as pw

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_figure2_example_prints_the_papers_output():
    out = subprocess.run([sys.executable, str(ROOT / "examples" / "figure2.py")],
                         capture_output=True, text=True, timeout=300, check=True)
    assert out.stdout.strip() == "(array([3., 5.]), array([2., 4.]))"


def test_program_is_one_dataflow_program():
    s = pw.make_virtual_device_set().add_slice(devices=2)
    double = pw.pmap(lambda x: x * 2.0, devices=s)

    @pw.program
    def twice(v):
        return double(double(v))

    np.testing.assert_array_equal(twice(np.array([1.0, 2.0], np.float32)), [4.0, 8.0])
    graph = twice.explain(np.array([1.0, 2.0], np.float32))
    assert graph.count("Compute") == 2 and "Arg" in graph and "Result" in graph


def test_op_by_op_call_outside_a_program():
    s = pw.make_virtual_device_set().add_slice(devices=2)
    inc = pw.pmap(lambda x: x + 1, devices=s)
    np.testing.assert_array_equal(inc(np.array([1, 2], np.int32)), [2, 3])


def test_errors_are_python_exceptions_with_the_status_message():
    with pytest.raises(RuntimeError, match="devices"):
        pw.make_virtual_device_set().add_slice(devices=10_000)
    s = pw.make_virtual_device_set().add_slice(devices=2)
    f = pw.pmap(lambda x: x * 2.0, devices=s)
    with pytest.raises(RuntimeError, match="divisible|expects|sharding"):
        pw.program(lambda v: f(v))(np.zeros((3,), np.float32))  # 3 rows over 2 devices

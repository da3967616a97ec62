"""The documentation's figures are drawn from the committed benchmark results.

Each SVG in docs/_static/figures/ records the SHA-256 of the JSON it was
drawn from (docs/figures.py); a result saved again without redrawing its
figure fails here, naming the command that redraws it. With matplotlib
installed (the docs extra), the figures are also drawn afresh, and each
result's record says how it was measured.
"""

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "docs"))

import figures  # noqa: E402


@pytest.mark.parametrize("name", sorted(figures.SOURCES))
def test_each_figure_was_drawn_from_the_committed_result(name):
    source = figures.RESULTS / figures.SOURCES[name]
    svg = figures.FIGURES / f"{name}.svg"
    assert source.is_file(), f"no saved result {source}: see docs/figures.py for its benchmark"
    assert svg.is_file(), f"no figure {svg}: run python docs/figures.py {name}"
    assert figures.recorded_hash(svg) == figures.data_hash(source), (
        f"{svg.name} was drawn from another version of {source.name}: "
        f"run python docs/figures.py {name}")


@pytest.mark.parametrize("name", sorted(set(figures.SOURCES.values())))
def test_each_result_says_how_it_was_measured(name):
    import json

    record = json.loads((figures.RESULTS / name).read_text())["measured_on"]
    assert record["command"].startswith("python benchmarks/"), record
    for field in ("date", "torch", "python", "cpus", "distspawn_commit"):
        assert record[field], (name, field)


def test_the_headline_and_captions_come_from_the_data(tmp_path):
    figures.write_captions(tmp_path)
    summary = figures.corpus_summary(figures.load("sessions"))
    text = (tmp_path / "corpus-summary.inc").read_text()
    assert f"**{summary['counted_ratio']:.1f}x**" in text and f"{summary['tests']} tests" in text
    assert f"({summary['ratio']:.1f}x with them)" in text
    for name in figures.SOURCES:
        command = figures.load(name)["measured_on"]["command"].split(" --save")[0]
        shown = (tmp_path / f"{name}.inc").read_text()
        assert command.split(" --corpus")[0] in shown and "--save" in shown, shown


@pytest.mark.skipif(importlib.util.find_spec("matplotlib") is None,
                    reason="matplotlib is not installed (the docs extra has it)")
def test_the_script_draws_every_figure_with_its_data_hash(tmp_path):
    written = figures.draw(sorted(figures.SOURCES), tmp_path)
    assert sorted(p.name for p in written) == sorted(f"{n}.svg" for n in figures.SOURCES)
    for path in written:
        name = path.stem
        assert figures.recorded_hash(path) == figures.data_hash(
            figures.RESULTS / figures.SOURCES[name])

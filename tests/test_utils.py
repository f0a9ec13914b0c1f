"""rhlab.utils: the one JSONL reader (two rules for the last line: torn_tail) and the one pydantic error formatter."""

import pytest
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from rhlab.utils import append_jsonl, format_validation_error, read_jsonl, truncate_jsonl

ROWS = [{"step": 1, "r": 0.5}, {"step": 2, "r": 1.0}]


def _write(tmp_path, tail: str):
    path = tmp_path / "metrics.jsonl"
    for row in ROWS:
        append_jsonl(path, row)
    with open(path, "a") as f:
        f.write(tail)
    return path


def test_torn_last_line_dropped_only_when_asked(tmp_path):
    path = _write(tmp_path, '{"step": 3, "r"')  # a row cut off mid-write: no newline
    assert read_jsonl(path, torn_tail=True) == ROWS
    with pytest.raises(ValueError, match=rf"{path}: line 3 is not valid JSON"):
        read_jsonl(path)


@pytest.mark.parametrize("tail", ['{"step": 3, oops}\n', '{"step": 3, oops}\n{"step": 4}\n'])
@pytest.mark.parametrize("torn_tail", [False, True])
def test_a_complete_bad_line_raises_under_both_rules(tmp_path, tail, torn_tail):
    """A bad line that ends in a newline, last or not, was written whole: never dropped."""
    with pytest.raises(ValueError, match="line 3 is not valid JSON"):
        read_jsonl(_write(tmp_path, tail), torn_tail=torn_tail)


def test_blank_lines_missing_file_and_non_objects(tmp_path):
    path = _write(tmp_path, "\n  \n")
    assert read_jsonl(path) == ROWS
    assert read_jsonl(tmp_path / "none.jsonl") == []
    path.write_text('{"step": 1}\n[1, 2]\n')
    with pytest.raises(ValueError, match="line 2 must be a JSON object, got list"):
        read_jsonl(path, torn_tail=True)


def test_truncate_for_a_resume_drops_later_rows_and_a_torn_tail(tmp_path):
    path = _write(tmp_path, '{"step": 3}\n{"step": 4, "r": 1')  # killed while writing step 4
    truncate_jsonl(path, 2)
    assert path.read_text().endswith("\n") and read_jsonl(path) == ROWS


class _Inner(BaseModel):
    model_config = ConfigDict(extra="forbid")
    k: int = 1
    j: str = "a"


class _Outer(BaseModel):
    model_config = ConfigDict(extra="forbid")
    n: int = Field(gt=0)
    inner: _Inner = _Inner()
    items: list[_Inner] = []


def _error(data) -> ValidationError:
    with pytest.raises(ValidationError) as e:
        _Outer.model_validate(data)
    return e.value


def test_one_formatter_names_each_key_on_one_line():
    err = _error({"n": 0, "inner": {"x": 1}, "items": [{"k": "many"}]})
    assert format_validation_error(err, _Outer) == (
        "n: Input should be greater than 0 (got 0); inner.x: unknown key; allowed: j, k; "
        "items.0.k: Input should be a valid integer, unable to parse string as an integer (got 'many')")
    # params of a registered component: under a prefix, naming the component
    err = _error({"inner": {}, "typo": 1})
    assert format_validation_error(err, _Outer, "intervention.params", "intervention 'x'") == (
        "intervention.params.n: required by intervention 'x'; "
        "intervention.params.typo: unknown key for intervention 'x'; allowed: inner, items, n")
    assert format_validation_error(_error({}), _Outer) == "n: Field required"
    assert format_validation_error(_error([1]), _Outer).startswith("<root>: Input should be a valid dictionary")

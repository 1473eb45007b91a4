"""The one TOML validator: every error names the file and the key, the same way for every file."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.suites import SuiteError
from harness.tomlcheck import (
    InvalidTOML,
    Where,
    check_keys,
    load_toml,
    need_choice,
    need_int,
    need_list,
    need_number,
    need_str,
    need_table,
    need_tables,
)


def test_where_names_the_file_the_table_and_the_key() -> None:
    w = Where("suites/smoke.toml")
    assert str(w / "version") == "suites/smoke.toml: version"
    assert str(w / "kv") == "suites/smoke.toml: kv"
    assert str(w / "kv" / "block_size") == "suites/smoke.toml: [kv].block_size"
    assert str(w / "kv" / "load" / "requests") == "suites/smoke.toml: [kv.load].requests"
    assert str(w / "cases" / 2) == "suites/smoke.toml: [cases[2]]"
    assert (
        str(w / "sampling_gate" / "settings" / 0 / "top_k")
        == "suites/smoke.toml: [sampling_gate.settings[0]].top_k"
    )


def test_a_wrong_type_names_file_key_and_value() -> None:
    w = Where("suites/smoke.toml", error=SuiteError)
    with pytest.raises(SuiteError) as e:
        need_int({"block_size": "x"}, "block_size", w / "kv", lo=1)
    assert str(e.value) == "suites/smoke.toml: [kv].block_size: expected an integer >= 1, got 'x'"
    with pytest.raises(InvalidTOML, match=r"\[kv\].on: expected an integer, got True"):
        need_int({"on": True}, "on", w / "kv")  # a bool is not an integer
    with pytest.raises(InvalidTOML, match=r"x.toml: \[a\].p: expected a number in \(0, 1\], got 0"):
        need_number({"p": 0}, "p", Where("x.toml") / "a", lo=0, hi=1, lo_open=True)
    with pytest.raises(InvalidTOML, match=r"x.toml: device: expected one of cpu, cuda, got 'tpu'"):
        need_choice({"device": "tpu"}, "device", Where("x.toml"), ("cpu", "cuda"))


def test_a_missing_key_says_what_it_expected() -> None:
    w = Where("suites/s.toml", error=SuiteError)
    with pytest.raises(SuiteError) as e:
        need_str({}, "name", w)
    assert str(e.value) == "suites/s.toml: name: missing (expected a non-empty string)"
    with pytest.raises(
        SuiteError, match=r"s.toml: \[sampling\].max_tokens: missing \(expected an integer >= 1\)"
    ):
        need_int(need_table({"sampling": {}}, "sampling", w), "max_tokens", w / "sampling", lo=1)
    assert need_int({}, "seed", w, 7) == 7 and need_int({}, "refuse", w, None) is None


def test_an_unknown_key_gets_the_closest_valid_ones() -> None:
    w = Where("suites/kv_load.toml", error=SuiteError) / "kv" / "load"
    with pytest.raises(SuiteError) as e:
        check_keys({"requests": 1, "requets": 2}, w, ("requests", "seed", "pool_blocks"))
    msg = str(e.value)
    assert msg.startswith("suites/kv_load.toml: [kv.load].requets: unknown key 'requets'.")
    assert "Did you mean 'requests'?" in msg and "Valid: pool_blocks, requests, seed" in msg


def test_a_nested_table_and_an_array_of_tables_name_their_place() -> None:
    raw = {"sampling_gate": {"settings": [{"id": "a", "top_k": 3}, {"id": "b", "top_k": -1}]}}
    w = Where("suites/sampling.toml", error=SuiteError)
    gate = need_table(raw, "sampling_gate", w)
    with pytest.raises(SuiteError) as e:
        for sw, s in need_tables(gate, "settings", w / "sampling_gate"):
            need_int(s, "top_k", sw, lo=0)
    assert str(e.value) == (
        "suites/sampling.toml: [sampling_gate.settings[1]].top_k: expected an integer >= 0, got -1"
    )
    with pytest.raises(
        SuiteError,
        match=r"sampling.toml: \[sampling_gate\].settings: expected an array of "
        r"tables \(\[\[sampling_gate.settings\]\]\) with at least one, got \[\]",
    ):
        list(need_tables({"settings": []}, "settings", w / "sampling_gate"))
    with pytest.raises(SuiteError, match=r"sampling.toml: sampling_gate: expected a table, got 3"):
        need_table({"sampling_gate": 3}, "sampling_gate", w)


def test_lists_and_files(tmp_path: Path) -> None:
    w = Where("fleet.toml") / "group" / 0
    assert need_list({"m": ["a", "b"]}, "m", w, unique=True) == ["a", "b"]
    with pytest.raises(InvalidTOML, match=r"fleet.toml: \[group\[0\]\].m: lists 'a' twice"):
        need_list({"m": ["a", "a"]}, "m", w, unique=True)
    with pytest.raises(
        InvalidTOML, match=r"\[group\[0\]\].m: expected a non-empty list of strings, got \[\]"
    ):
        need_list({"m": []}, "m", w)
    bad = tmp_path / "bad.toml"
    bad.write_text("[[[")
    with pytest.raises(SuiteError, match="bad.toml: not valid TOML"):
        load_toml(bad, SuiteError)
    with pytest.raises(InvalidTOML, match="none.toml: no catalog"):
        load_toml(tmp_path / "none.toml", missing="no catalog")

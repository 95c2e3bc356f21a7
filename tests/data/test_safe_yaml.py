"""Configs read within bounds: the size cap and the alias-expansion cap refuse in one sentence, and an environment
variable lifts each."""

from __future__ import annotations

import pytest

from bad_inputs.corpus import ALIAS_BOMB
from gradian.data.run_folder import read_config_file
from gradian.errors import InputError


def test_anchors_a_config_uses_are_read(tmp_path):
    path = tmp_path / "axolotl.yaml"
    path.write_text("base: &base {lr: 0.0002, epochs: 3}\nrun:\n  <<: *base\n  epochs: 4\nother: *base\n")
    assert read_config_file(path) == {"base": {"lr": 0.0002, "epochs": 3}, "run": {"lr": 0.0002, "epochs": 4},
                                      "other": {"lr": 0.0002, "epochs": 3}}


def test_an_alias_bomb_is_refused_and_the_cap_can_be_lifted(tmp_path, monkeypatch):
    path = tmp_path / "sft_config.yaml"
    path.write_text(ALIAS_BOMB)
    with pytest.raises(InputError, match=r"expands to 6,053,451 values .* set GRADIAN_MAX_CONFIG_NODES"):
        read_config_file(path)
    monkeypatch.setenv("GRADIAN_MAX_CONFIG_NODES", "10000000")
    assert len(read_config_file(path)["g"]) == 9


def test_a_large_config_is_refused_and_the_cap_can_be_lifted(tmp_path, monkeypatch):
    path = tmp_path / "sft_config.yaml"
    path.write_text("# " + "x" * (1 << 20) + "\nmax_length: 64\n")
    with pytest.raises(InputError, match=r"sft_config.yaml: is 1,048,594 bytes, more than the 1,048,576"):
        read_config_file(path)
    monkeypatch.setenv("GRADIAN_MAX_CONFIG_BYTES", str(1 << 21))
    assert read_config_file(path) == {"max_length": 64}
    monkeypatch.setenv("GRADIAN_MAX_CONFIG_BYTES", "lots")
    with pytest.raises(InputError, match=r"\$GRADIAN_MAX_CONFIG_BYTES: should be a whole number"):
        read_config_file(path)


def test_a_recursive_alias_is_refused(tmp_path):
    path = tmp_path / "sft_config.yaml"
    path.write_text("a: &a [1, *a]\n")
    with pytest.raises(InputError, match="alias inside its own anchor"):
        read_config_file(path)

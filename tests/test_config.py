import pytest
import yaml
from pydantic import BaseModel

from mimesis_lab import config as C
from tests.conftest import ROOT


def _params():
    return yaml.safe_load((ROOT / "params.yaml").read_text())


def test_bundled_params_validate():
    p = C.load_params(ROOT / "params.yaml")
    assert p.role_swap.no_swap_sources == ["tom_social"]
    assert abs(sum(p.splits.fractions.values()) - 1) < 1e-9
    assert p.validate_.fail_on_error is True


def test_unknown_key_is_named():
    d = _params()
    d["role_swap"]["sead"] = 1
    with pytest.raises(C.ConfigError, match=r"unknown key `role_swap.sead`"):
        C.parse_params(d, "params.yaml")


def test_unknown_section_is_named():
    d = _params()
    d["rolle_swap"] = {}
    with pytest.raises(C.ConfigError, match=r"unknown key `rolle_swap`"):
        C.parse_params(d)


@pytest.mark.parametrize("section,key,value", [
    ("role_swap", "seed", "1234"),
    ("thoughttrace", "include_reactions", "yes"),
    ("splits", "seed", 1.5),
    ("behaviors", "turn_budget", "8"),
])
def test_wrong_type_is_named(section, key, value):
    d = _params()
    d[section][key] = value
    with pytest.raises(C.ConfigError, match=rf"params.yaml: `{section}.{key}`"):
        C.parse_params(d, "params.yaml")


def test_fractions_must_sum_to_one():
    d = _params()
    d["splits"]["fractions"] = {"train": 0.8, "val": 0.3}
    with pytest.raises(C.ConfigError, match="splits.fractions"):
        C.parse_params(d)


def test_ratio_must_be_positive():
    d = _params()
    d["role_swap"]["mixture"] = {"data/raw/chats/*.jsonl": 0.0}
    with pytest.raises(C.ConfigError, match="role_swap.mixture"):
        C.parse_params(d)


def test_unreadable_and_invalid_yaml(tmp_path):
    with pytest.raises(C.ConfigError, match="cannot read"):
        C.load_params(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("role_swap: [unclosed\n")
    with pytest.raises(C.ConfigError, match="invalid YAML"):
        C.load_params(bad)


def _models(model: type[BaseModel], seen=None):
    seen = seen if seen is not None else set()
    if model in seen:
        return seen
    seen.add(model)
    for f in model.model_fields.values():
        ann = f.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            _models(ann, seen)
    return seen


def test_every_field_has_help_text():
    for model in _models(C.Params):
        for name, f in model.model_fields.items():
            assert f.description, f"{model.__name__}.{name} has no help text"


def test_flatten():
    assert C.flatten({"a": {"b": 1, "c": {"d": "x"}}}) == {"a.b": 1, "a.c.d": "x"}


def test_profile_merge_cli(tmp_path):
    out = tmp_path / "merged.yaml"
    assert C.main(["--params", str(ROOT / "params.yaml"), "--profile",
                   str(ROOT / "configs/paper/params.paper.yaml"), "-o", str(out)]) == 0
    merged = C.load_params(out)
    assert merged.model.init == "pretrained" and merged.midtrain.deepspeed_config.startswith("configs/paper/")
    assert C.merge_profile({"a": {"b": 1, "c": 2}}, {"a": {"c": 3}}) == {"a": {"b": 1, "c": 3}}
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: {hidden_sise: 3}\n")
    assert C.main(["--params", str(ROOT / "params.yaml"), "--profile", str(bad)]) == 2

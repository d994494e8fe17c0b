"""Run configuration: presets with the paper's values, typed overrides, unknown keys."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2mc.config import (
    RunConfig,
    load_config,
    preset_names,
    resolve_signals,
)

RESOLVED = Path(__file__).parent / "data" / "presets_resolved.json"

# docs/method.md#settings-of-the-paper: (method, addon, lr after scaling, weight decay, base epoch)
PAPER = {
    "vicreg-e2mc": ("vicreg", "e2mc", 0.003 * 512 / 256, 1e-6, 1000),
    "vicreg-continued": ("vicreg", "none", 0.003 * 512 / 256, 1e-6, 1000),
    "swav-e2mc": ("swav", "e2mc", 0.001, 1e-6, 800),
    "swav-continued": ("swav", "none", 0.001, 1e-6, 800),
    "swav-vcreg": ("swav", "vcreg", 0.001, 1e-6, 800),
    "swav-uniformity": ("swav", "uniformity", 0.001, 1e-6, 800),
    "swav-mmcr": ("swav", "mmcr", 0.001, 1e-6, 800),
    "simsiam-e2mc": ("simsiam", "e2mc", 0.001 * 512 / 256, 1e-4, 100),
    "simsiam-continued": ("simsiam", "none", 0.001 * 512 / 256, 1e-4, 100),
}


@pytest.mark.parametrize("name", sorted(PAPER))
def test_paper_presets(name: str) -> None:
    method, addon, lr, wd, base_epoch = PAPER[name]
    cfg = load_config(name)
    assert (cfg.mode, cfg.method.name, cfg.addon.name) == ("continue", method, addon)
    assert cfg.model.backbone == "resnet50" and not cfg.model.small_images
    assert cfg.training.batch_size == 512 and cfg.training.epochs == 10
    assert cfg.optim.schedule == "constant"
    assert cfg.lr == pytest.approx(lr, rel=1e-12)
    assert cfg.optim.weight_decay == wd
    assert cfg.init.base_epoch == base_epoch
    assert cfg.data.image_size == 224 and cfg.data.channels == 3


def test_paper_coefficients() -> None:
    e2mc = {n: load_config(n).addon.params for n in ("vicreg-e2mc", "swav-e2mc", "simsiam-e2mc")}
    assert (e2mc["vicreg-e2mc"]["beta"], e2mc["vicreg-e2mc"]["gamma"]) == (1000, 100)
    assert (e2mc["swav-e2mc"]["beta"], e2mc["swav-e2mc"]["gamma"]) == (1, 25)
    assert (e2mc["simsiam-e2mc"]["beta"], e2mc["simsiam-e2mc"]["gamma"]) == (0.001, 0.01)
    assert e2mc["vicreg-e2mc"]["space"] == "hypercube" and e2mc["vicreg-e2mc"]["eps"] == 1e-7
    for n in ("swav-e2mc", "simsiam-e2mc"):
        assert e2mc[n]["space"] == "hypersphere"
        assert e2mc[n]["eps"] == pytest.approx(1.1920928955078125e-07)  # float32 eps
    assert all(p["view_reduction"] == "mean" for p in e2mc.values())  # entropies averaged
    assert load_config("swav-vcreg").addon.params == {"mu": 0.1, "nu": 0.001}
    assert load_config("swav-uniformity").addon.params == {"lam": 0.5, "t": 2.0}
    assert load_config("swav-mmcr").addon.params == {"lam": 0.005}
    swav = load_config("swav-e2mc").method.params
    assert (swav["queue_length"], swav["queue_start_epoch"], swav["n_prototypes"]) == (3584, 0,
                                                                                       3000)
    assert (swav["temperature"], swav["epsilon"], swav["sinkhorn_iterations"]) == (0.1, 0.05, 3)
    sim = load_config("simsiam-e2mc")
    assert sim.method.params["predictor_lr"] == 0.1 and sim.optim.params["momentum"] == 0.9
    vic = load_config("vicreg-e2mc")
    assert vic.optim.params["eta"] == 0.001 and vic.init.load_optimizer


def test_every_preset_loads_and_small_presets_are_cpu_sized() -> None:
    names = preset_names()
    assert set(PAPER) <= set(names)
    small = [n for n in names if n.startswith("fmnist-")]
    assert {"fmnist-vicreg-pretrain", "fmnist-vicreg-e2mc"} <= set(small)
    for n in small:
        cfg = load_config(n)
        assert (cfg.data.dataset, cfg.data.image_size, cfg.model.in_channels) == ("builtin", 28,
                                                                                  1)
        assert cfg.model.backbone in ("cnn5_small", "vit_tiny_p4_28")  # the package's small
        assert cfg.training.precision == "fp32"                     # CNN and ViT


def test_overrides_are_coerced_to_the_field_types() -> None:
    cfg = load_config("vicreg-e2mc", ["training.epochs=3", "optim.base_lr=1e-3",
                                      "training.skip_nonfinite=yes", "init.base_epoch=null",
                                      "addon.params.beta=10", "data.dataset=/x y",
                                      "method.params.projector=64-64"])
    assert cfg.training.epochs == 3 and isinstance(cfg.training.epochs, int)
    assert cfg.optim.base_lr == 1e-3 and isinstance(cfg.optim.base_lr, float)
    assert cfg.training.skip_nonfinite is True and cfg.init.base_epoch is None
    assert cfg.addon.params["beta"] == 10 and cfg.addon.params["gamma"] == 100
    assert cfg.data.dataset == "/x y" and cfg.method.params["projector"] == "64-64"


@pytest.mark.parametrize("override, message", [
    ("training.epohs=3", "training.epohs"),
    ("traning.epochs=3", "traning"),
    ("training.epochs=three", "training.epochs"),
    ("training.epochs=2.5", "training.epochs"),
    ("training.skip_nonfinite=maybe", "training.skip_nonfinite"),
    ("training.precision=fp8", "training.precision"),
    ("training=3", "section"),
    ("training.epochs", "key.sub=value"),
])
def test_bad_overrides_name_the_key(override: str, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace(".", r"\.")):
        load_config("swav-e2mc", [override])


def test_unknown_key_in_a_yaml_file(tmp_path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("training: {epochs: 2, learning_rate: 0.1}\n")
    with pytest.raises(ValueError, match=r"training\.learning_rate"):
        load_config(str(path))
    with pytest.raises(ValueError, match="unknown preset 'nope'"):
        load_config("nope")


# the list fields: (key, the old comma string, the same as a YAML list, the typed value)
LIST_FIELDS = [
    ("monitor.fractions", "0.1,0.5", "[0.1, 0.5]", [0.1, 0.5]),
    ("monitor.label_seeds", "3, 4", "[3, 4]", [3, 4]),
    ("training.preempt_signals", "SIGUSR2,term", "[SIGUSR2, term]", ["SIGUSR2", "term"]),
]


@pytest.mark.parametrize("key, comma, listed, value", LIST_FIELDS)
def test_a_list_field_takes_a_yaml_list_or_the_old_comma_string(
        tmp_path, key: str, comma: str, listed: str, value: list[Any]) -> None:
    section, name = key.split(".")
    configs = [load_config("swav-e2mc", [f"{key}={text}"]) for text in (comma, listed)]
    for text in (comma, listed):  # in a YAML file, through its base
        path = tmp_path / "run.yaml"
        path.write_text(f"base: swav-e2mc\n{section}:\n  {name}: {text}\n")
        configs.append(load_config(str(path)))
    path.write_text(f"base: swav-e2mc\n{section}:\n  {name}:\n"
                    + "".join(f"    - {v}\n" for v in value))  # a block list
    configs.append(load_config(str(path)))
    assert [getattr(getattr(c, section), name) for c in configs] == [value] * len(configs)
    assert all(c == configs[0] for c in configs)
    old = load_config("swav-e2mc").to_dict()  # a config recorded with the comma string
    old[section][name] = comma
    assert _recorded(tmp_path, old) == configs[0]


def test_no_preemption_signals_is_an_empty_list() -> None:
    for text in ("", "[]", "none"):
        cfg = load_config("swav-e2mc", [f"training.preempt_signals={text}"])
        assert resolve_signals(cfg.training.preempt_signals) == ()


def test_bad_list_values_name_the_key() -> None:
    for override, message in (("monitor.fractions=0.1,x", "monitor.fractions"),
                              ("monitor.fractions=0.5,0.5", "distinct fractions"),
                              ("monitor.fractions=[0, 1]", "distinct fractions"),
                              ("monitor.label_seeds=1,-1", "monitor.label_seeds"),
                              ("monitor.fractions={a: 1}", "monitor.fractions"),
                              ("training.preempt_signals=[SIGFOO]", "unknown signal 'SIGFOO'")):
        with pytest.raises(ValueError, match=message):
            load_config("swav-e2mc", [override])


def test_values_keep_their_meaning_through_omegaconf(tmp_path) -> None:
    # what the conversion did before OmegaConf did it: ${...} and YAML dates are text,
    # integral numbers are integers, only the boolean words are booleans, a mapping replaces
    path = tmp_path / "run.yaml"
    path.write_text("base: swav-e2mc\nlogging: {wandb_name: 2024-05-01}\n"
                    "data:\n  dataset: ${HOME}/data\ntraining: {epochs: 3.0}\n")
    cfg = load_config(str(path), ["init.checkpoint=${x}.pt", "training.batch_size=1e2",
                                  "addon.params={}", "logging.wandb_project=1e5"])
    assert (cfg.logging.wandb_name, cfg.data.dataset, cfg.init.checkpoint) == (
        "2024-05-01", "${HOME}/data", "${x}.pt")
    assert (cfg.training.epochs, cfg.training.batch_size) == (3, 100)
    assert cfg.addon.params == {} and cfg.logging.wandb_project == "1e5"
    for word in ("y", "2"):
        with pytest.raises(ValueError, match="training.progress' expects a boolean"):
            load_config("swav-e2mc", [f"training.progress={word}"])


def _recorded(tmp_path: Path, data: dict[str, Any]) -> RunConfig:
    """A configuration as a run records it (``RunConfig.to_dict``), read back as a file."""
    path = tmp_path / "recorded.yaml"
    path.write_text(yaml.safe_dump(data))
    return load_config(str(path))


def test_resolved_config_round_trips_through_yaml(tmp_path) -> None:
    cfg = load_config("swav-mmcr", ["training.seed=7"])
    again = _recorded(tmp_path, yaml.safe_load(cfg.to_yaml()))
    assert again == cfg and again != RunConfig()


def _with_defaults(defaults: dict[str, Any], recorded: dict[str, Any]) -> dict[str, Any]:
    """``recorded`` over ``defaults``: fields added to RunConfig after the fixture was written
    keep their default value (a preset that sets one must be re-recorded)."""
    merged = dict(defaults)
    for key, value in recorded.items():
        if isinstance(value, dict) and isinstance(defaults.get(key), dict) and key != "params":
            merged[key] = _with_defaults(defaults[key], value)
        else:
            merged[key] = value
    return merged


def test_every_preset_resolves_to_its_recorded_config() -> None:
    # tests/data/presets_resolved.json: RunConfig.to_dict() of every preset, recorded when the
    # presets were still full copies (before `base:` inheritance). Whoever changes a preset's
    # values on purpose re-records it (from the repository root):
    #   python -c "import json; from e2mc.config import load_config as c, preset_names
    #   as n; print(json.dumps({p: c(p).to_dict() for p in n()}, indent=1, sort_keys=True))" \
    #   > tests/data/presets_resolved.json
    recorded = json.loads(RESOLVED.read_text())
    assert sorted(recorded) == preset_names()
    defaults = RunConfig().to_dict()
    for name, values in recorded.items():
        assert load_config(name).to_dict() == _with_defaults(defaults, values), name


def test_presets_inherit_and_state_only_their_differences() -> None:
    from importlib import resources

    from e2mc.config import preset_summary

    assert preset_summary("vicreg-e2mc")[0] == "vicreg-continued"
    raw = yaml.safe_load((resources.files("e2mc") / "configs" / "vicreg-e2mc.yaml").read_text())
    assert set(raw) == {"base", "name", "addon"}
    e2mc, continued = load_config("vicreg-e2mc"), load_config("vicreg-continued")
    e2mc.addon, e2mc.name = continued.addon, continued.name
    assert e2mc == continued  # the add-on and the name are the only differences


def test_a_user_file_inherits_through_a_chain(tmp_path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "mid.yaml").write_text(
        "base: fmnist-swav-e2mc\nname: mid\naddon: {params: {beta: 3}}\n"
        "method: {params: {n_prototypes: 7}}\ntraining: {epochs: 2}\n")
    (tmp_path / "top.yaml").write_text("base: sub/mid.yaml\ntraining: {seed: 4}\n")
    cfg = load_config(str(tmp_path / "top.yaml"), ["training.batch_size=64"])
    ref = load_config("fmnist-swav-e2mc")
    assert (cfg.name, cfg.training.epochs, cfg.training.seed, cfg.training.batch_size) == (
        "mid", 2, 4, 64)
    # params merge key by key: beta changed, gamma and the rest kept
    assert cfg.addon.params == {**ref.addon.params, "beta": 3}
    assert cfg.method.params == {**ref.method.params, "n_prototypes": 7}
    assert cfg.optim == ref.optim and cfg.model == ref.model


def test_a_new_addon_name_starts_its_params_afresh(tmp_path) -> None:
    path = tmp_path / "x.yaml"
    path.write_text("base: swav-e2mc\naddon: {name: mmcr, params: {lam: 0.1}}\n")
    assert load_config(str(path)).addon.params == {"lam": 0.1}  # no stale beta / gamma
    path.write_text("base: swav-e2mc\naddon: {params: null}\n")
    assert load_config(str(path)).addon.params == {}


def test_inheritance_cycles_and_bad_bases_are_clear_errors(tmp_path) -> None:
    (tmp_path / "a.yaml").write_text("base: b.yaml\n")
    (tmp_path / "b.yaml").write_text("base: a.yaml\n")
    with pytest.raises(ValueError, match=r"cycle: .*a\.yaml -> .*b\.yaml -> .*a\.yaml"):
        load_config(str(tmp_path / "a.yaml"))
    (tmp_path / "self.yaml").write_text("base: self.yaml\n")
    with pytest.raises(ValueError, match="cycle"):
        load_config(str(tmp_path / "self.yaml"))
    (tmp_path / "c.yaml").write_text("base: vicreg-e2mcc\n")
    with pytest.raises(ValueError, match="unknown preset 'vicreg-e2mcc'; did you mean vicreg-e2mc"):
        load_config(str(tmp_path / "c.yaml"))
    (tmp_path / "d.yaml").write_text("base: [vicreg-e2mc]\n")
    with pytest.raises(ValueError, match="'base' must be a preset name"):
        load_config(str(tmp_path / "d.yaml"))
    (tmp_path / "bad.yaml").write_text("training: {epochs: 2\n")
    with pytest.raises(ValueError, match=r"bad\.yaml: not valid YAML"):
        load_config(str(tmp_path / "bad.yaml"))
    (tmp_path / "e.yaml").write_text("base: missing.yaml\n")
    with pytest.raises(ValueError, match="'missing.yaml' does not exist"):
        load_config(str(tmp_path / "e.yaml"))


def test_an_unknown_key_is_reported_with_the_file_that_has_it(tmp_path) -> None:
    (tmp_path / "parent.yaml").write_text("base: vicreg-e2mc\noptim: {lr: 0.1}\n")
    (tmp_path / "child.yaml").write_text("base: parent.yaml\ntraining: {epochs: 1}\n")
    with pytest.raises(ValueError, match=r"parent\.yaml: unknown config key 'optim\.lr'"):
        load_config(str(tmp_path / "child.yaml"))


def test_config_show_prints_every_preset_as_recorded(capsys) -> None:
    from e2mc.cli import main

    recorded = json.loads(RESOLVED.read_text())
    defaults = RunConfig().to_dict()
    for name, values in recorded.items():
        assert main(["config", "show", name]) == 0
        assert yaml.safe_load(capsys.readouterr().out) == _with_defaults(defaults, values), name
    assert main(["config", "show", "swav-e2mc", "--set", "addon.params.beta=2"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["addon"]["params"]["beta"] == 2


def test_config_show_bad_input_is_one_error_line(capsys, tmp_path) -> None:
    from e2mc.cli import main

    (tmp_path / "loop.yaml").write_text("base: loop.yaml\n")
    for argv, message in ((["config", "show", "nope"], "unknown preset 'nope'"),
                          (["config", "show", str(tmp_path / "loop.yaml")], "cycle"),
                          (["config", "show", "swav-e2mc", "--set", "x.y=1"],
                           "unknown config key")):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert "error:" in err and message in err and "Traceback" not in err


def test_presets_lists_one_line_per_preset(capsys) -> None:
    from e2mc.cli import main

    assert main(["presets"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == preset_names()
    by_name = {line.split()[0]: line for line in lines}
    assert "[base: vicreg-continued]" in by_name["vicreg-e2mc"]
    assert "beta 1000, gamma 100" in by_name["vicreg-e2mc"]
    assert all(len(line.split()) > 3 for line in lines)  # every preset has a description


def test_the_preset_table_in_docs_is_the_generated_one() -> None:
    from e2mc.commands.presets import markdown_table

    doc = (Path(__file__).parents[1] / "docs" / "method.md").read_text()
    start = doc.index("<!-- presets table: generated by `e2mc presets --markdown` -->\n")
    table = doc[doc.index("\n", start) + 1: doc.index("<!-- end of presets table -->")]
    assert table == markdown_table(preset_names()), "regenerate: e2mc presets --markdown"


@pytest.mark.parametrize("old,new", [("fmnist-vicreg-continue", "fmnist-vicreg-continued"),
                                     ("fmnist-swav-continue-e2mc", "fmnist-swav-e2mc")])
def test_preset_of_the_first_naming_scheme_says_its_new_name(old, new):
    with pytest.raises(ValueError, match=f"^preset '{old}' was renamed to '{new}'$"):
        load_config(old)

"""The configuration machinery of the core layer, on sections it is handed (it never sees the roster)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from pydantic import Field

from deep_sleep.core.config import (
    BaseConsolidationConfig,
    GatingConfig,
    PhaseConfig,
    assemble,
    load,
)
from deep_sleep.core.errors import ConfigError


class AlphaConfig(PhaseConfig):
    size: int = Field(2, ge=1)


class BetaConfig(PhaseConfig):
    """No knobs but ``enabled``."""


def test_assemble_puts_the_sections_after_the_top_level_knobs():
    Model = assemble({"alpha": AlphaConfig, "beta": BetaConfig})
    assert list(Model.model_fields) == ["lookback_hours", "quick_nap_interval", "gating", "health", "retention", "llm", "quarantine", "holds", "gate", "embedding", "recall", "alpha", "beta"]
    assert Model.phase_sections() == ["alpha", "beta"]
    got = Model()
    assert got.alpha == AlphaConfig() and got.beta.enabled and got.gating == GatingConfig()
    assert isinstance(got, BaseConsolidationConfig) and got.phase("alpha") is got.alpha


def test_a_section_may_not_hide_a_top_level_knob_nor_be_something_else():
    with pytest.raises(ConfigError, match="phase 'gating' would hide the top-level knob"):
        assemble({"gating": AlphaConfig})
    with pytest.raises(ConfigError, match="not a PhaseConfig subclass"):
        assemble({"alpha": GatingConfig})


def test_asking_for_a_section_that_is_not_there_names_the_sections():
    with pytest.raises(ConfigError, match="no section for phase 'gamma'; phase sections are: alpha, beta"):
        assemble({"alpha": AlphaConfig, "beta": BetaConfig})().phase("gamma")
    with pytest.raises(ConfigError, match="no section for phase 'gating'"):
        assemble({"alpha": AlphaConfig})().phase("gating")


def test_load_names_the_file_and_the_bad_knob(tmp_path, monkeypatch):
    monkeypatch.delenv("DEEP_SLEEP_CONFIG", raising=False)
    Model = assemble({"alpha": AlphaConfig})
    with pytest.raises(ConfigError, match="does not exist"):
        load(Model, tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[alpha\n")
    with pytest.raises(ConfigError, match="is not valid TOML"):
        load(Model, bad)
    good = tmp_path / "good.toml"
    good.write_text("[alpha]\nsize = 5\n")
    monkeypatch.setenv("DEEP_SLEEP_CONFIG", str(good))
    assert load(Model).alpha.size == 5  # DEEP_SLEEP_CONFIG names the file when no path is given
    monkeypatch.setenv("DEEP_SLEEP_ALPHA__SIZE", "0")
    with pytest.raises(ConfigError, match=r"\(from .*good\.toml\): alpha\.size: Input should be greater than or equal to 1"):
        load(Model)


# ---------------------------------------------------------------------------------------------
# issue 32: config files read with clear errors, and strict types


def test_config_files_that_cannot_be_read_name_the_file_and_the_fix(tmp_path, monkeypatch):
    monkeypatch.delenv("DEEP_SLEEP_CONFIG", raising=False)
    Model = assemble({"alpha": AlphaConfig})
    with pytest.raises(ConfigError, match=rf"config file {tmp_path} is a directory; give the path of a TOML file in it "
                                          rf"\(e\.g\. {tmp_path}/deep-sleep\.toml\)"):
        load(Model, tmp_path)
    latin1 = tmp_path / "latin1.toml"
    latin1.write_bytes("# réglages\n[alpha]\nsize = 3\n".encode("latin-1"))
    with pytest.raises(ConfigError, match=rf"config file {latin1} is not UTF-8 text \(byte 0xe9 on line 1\); "
                                          "TOML files are UTF-8: save it as UTF-8"):
        load(Model, latin1)
    bom = tmp_path / "bom.toml"
    bom.write_bytes("\ufeff[alpha]\nsize = 3\n".encode("utf-8"))  # what some editors write: read
    assert load(Model, bom).alpha.size == 3


CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, CAP_SETPCAP = 1, 2, 8
PR_CAPBSET_DROP = 24


def _capabilities() -> dict[str, int]:
    """This process's capability sets (``/proc/self/status``: CapInh, CapPrm, CapEff, CapBnd, CapAmb)."""
    with open("/proc/self/status") as fh:
        return {k: int(v, 16) for k, v in (line.split(":") for line in fh if line.startswith("Cap"))}


def _as_unprivileged() -> dict:
    """``subprocess.run`` arguments that start a child without the powers that let root read any
    file.  Not root: none.  Root: the child keeps uid 0 (it can still execute an interpreter that
    lives under root's home, which ``nobody`` cannot) but CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH
    are dropped from its bounding set before it execs, so the new program never gets them and a
    mode-000 file is EACCES to it, as to any user.  Only where that is impossible (no CAP_SETPCAP,
    or the capabilities are inheritable or ambient, so the drop would not take) it runs as
    ``nobody`` (uid 65534)."""
    if os.geteuid() != 0:
        return {}
    dac = (1 << CAP_DAC_OVERRIDE) | (1 << CAP_DAC_READ_SEARCH)
    try:
        caps = _capabilities()
    except OSError:
        caps = {}
    if caps and caps["CapEff"] & (1 << CAP_SETPCAP) and not (caps["CapInh"] | caps["CapAmb"]) & dac:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)

        def drop() -> None:  # in the child, between fork and exec
            for cap in (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH):
                if libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
                    raise OSError(ctypes.get_errno(), f"prctl(PR_CAPBSET_DROP, {cap})")

        return {"preexec_fn": drop}
    return {"user": 65534}


def test_the_unprivileged_child_cannot_read_what_its_user_may_not():
    """The helper below really takes root's powers away: a child it starts cannot read a mode-000
    file (as root without the helper it could), and as root its capabilities lack both DAC bits."""
    import subprocess
    import sys
    import tempfile

    with tempfile.TemporaryDirectory(prefix="ds-locked-") as folder:
        os.chmod(folder, 0o755)
        locked = Path(folder) / "locked"
        locked.write_text("x")
        locked.chmod(0)
        code = (f"try:\n    open({str(locked)!r}).read()\n    print('read')\n"
                "except PermissionError:\n    print('denied')\n")
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, **_as_unprivileged())
        assert (done.returncode, done.stdout.strip()) == (0, "denied"), done.stderr[-2000:]


def test_an_unreadable_config_file_names_the_fix():
    """A file this user may not read: as root (who reads any file) the load runs in a child process
    without root's power to read any file (:func:`_as_unprivileged`)."""
    import shutil
    import subprocess
    import sys
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="ds-locked-"))
    try:
        folder.chmod(0o755)
        locked = folder / "locked.toml"
        locked.write_text("[alpha]\nsize = 3\n")
        locked.chmod(0)
        if os.geteuid() != 0:
            with pytest.raises(ConfigError, match="cannot be read \\(permission denied\\); make it readable by this user"):
                load(assemble({"alpha": AlphaConfig}), locked)
            return
        code = ("from deep_sleep.core.config import load, assemble\n"
                "from deep_sleep.core.errors import ConfigError\n"
                "from tests.core.test_config import AlphaConfig\n"
                f"try:\n    load(assemble({{'alpha': AlphaConfig}}), {str(locked)!r})\n"
                "except ConfigError as e:\n    print(e)\n")
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=Path.cwd(),
                              env={**os.environ, "PYTHONPATH": str(Path.cwd())}, timeout=120, **_as_unprivileged())
        assert done.returncode == 0, done.stderr[-2000:]
        assert done.stdout.strip() == (f"config file {locked} cannot be read (permission denied); "
                                       "make it readable by this user")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


class RatioConfig(PhaseConfig):
    share: float = Field(0.5, ge=0, le=1)
    limit: float | None = None


STRICT_CASES = [
    ('[ratio]\nshare = "0.5"', "ratio.share: expected a number such as 0.5, got the string '0.5'; write it without quotes if you mean it"),
    ("[ratio]\nshare = true", "ratio.share: expected a number such as 0.5, got true"),
    ("[ratio]\nshare = nan", "ratio.share: expected a number such as 0.5, got nan"),
    ("[ratio]\nlimit = false", "ratio.limit: expected a number such as 0.5, got false"),
    ("[alpha]\nsize = true", "alpha.size: expected an integer such as 3, got true"),
    ("[alpha]\nsize = 3.0", "alpha.size: expected an integer such as 3, got 3.0"),
    ('[alpha]\nsize = "3"', "alpha.size: expected an integer such as 3, got the string '3'"
     "; write it without quotes if you mean it"),
    ("[alpha]\nenabled = 1", "alpha.enabled: expected true or false, got 1"),
    ('[alpha]\nenabled = "true"', "alpha.enabled: expected true or false, got the string 'true'"
     "; write it without quotes if you mean it"),
    ('lookback_hours = "24"', "lookback_hours: expected a number such as 0.5, got the string '24'"
     "; write it without quotes if you mean it"),
    ("[gating]\nmin_sessions = true", "gating.min_sessions: expected an integer such as 3, got true"),
    # issue 37: inf passed as a number (1e400 is inf in TOML), and an integer past 64 bits as an integer
    ("lookback_hours = 1e400", "lookback_hours: expected a finite number such as 0.5, got inf"),
    ("lookback_hours = -inf", "lookback_hours: expected a finite number such as 0.5, got -inf"),
    ("[alpha]\nsize = 100000000000000000000", "alpha.size: expected an integer within 64 bits (-2^63 … 2^63-1), "
     "got an integer of 21 digits; give a reasonable value"),
    ('[holds]\nmax_delete_share = "0.5"', "holds.max_delete_share: expected a number such as 0.5, got the string '0.5'"
     "; write it without quotes if you mean it"),
    ("[llm]\nenabled = 1", "llm.enabled: expected true or false, got 1"),
    ("[quarantine]\nmax_label_chars = 99.5", "quarantine.max_label_chars: expected an integer such as 3, got 99.5"),
]


@pytest.mark.parametrize(("toml", "message"), STRICT_CASES)
def test_a_string_is_not_a_number_and_a_boolean_is_not_a_number_in_any_section(tmp_path, monkeypatch, toml, message):
    monkeypatch.delenv("DEEP_SLEEP_CONFIG", raising=False)
    file = tmp_path / "c.toml"
    file.write_text(toml + "\n")
    with pytest.raises(ConfigError) as caught:
        load(assemble({"alpha": AlphaConfig, "ratio": RatioConfig}), file)
    assert str(caught.value) == f"invalid configuration (from {file}): {message}"


def test_values_of_their_own_type_are_taken(tmp_path):
    file = tmp_path / "c.toml"
    file.write_text('lookback_hours = 12\n[ratio]\nshare = 1\nlimit = 2.5\n[alpha]\nsize = 4\nenabled = false\n'
                    '[quarantine]\nmin_timestamp = "2000-01-01T00:00:00Z"\n[holds]\nmax_delete_share = 0.1\n')
    got = load(assemble({"alpha": AlphaConfig, "ratio": RatioConfig}), file)
    assert (got.lookback_hours, got.ratio.share, got.ratio.limit, got.alpha.size, got.alpha.enabled) == (12.0, 1.0, 2.5, 4, False)
    assert got.quarantine.min_timestamp.year == 2000 and got.holds.max_delete_share == 0.1
    assert AlphaConfig(size=3).size == 3
    with pytest.raises(ValueError, match="size: expected an integer such as 3, got the string '3'"):
        AlphaConfig(size="3")  # a section built directly is strict too


@pytest.mark.parametrize(("env", "expected"), [
    ({"DEEP_SLEEP_RATIO__SHARE": "0.75"}, ("ratio", "share", 0.75)),
    ({"DEEP_SLEEP_RATIO__SHARE": "1"}, ("ratio", "share", 1.0)),
    ({"DEEP_SLEEP_RATIO__LIMIT": "1e3"}, ("ratio", "limit", 1000.0)),
    ({"DEEP_SLEEP_ALPHA__SIZE": " 7 "}, ("alpha", "size", 7)),
    ({"DEEP_SLEEP_ALPHA__ENABLED": "false"}, ("alpha", "enabled", False)),
    ({"DEEP_SLEEP_LLM__ENABLED": "TRUE"}, ("llm", "enabled", True)),
    ({"DEEP_SLEEP_GATING": '{"min_sessions": 3}'}, ("gating", "min_sessions", 3)),
])
def test_environment_values_are_read_as_toml_writes_their_type(monkeypatch, env, expected):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    section, knob, value = expected
    assert getattr(getattr(load(assemble({"alpha": AlphaConfig, "ratio": RatioConfig})), section), knob) == value


def test_an_infinite_number_from_the_environment_is_refused(monkeypatch):
    monkeypatch.delenv("DEEP_SLEEP_CONFIG", raising=False)
    monkeypatch.setenv("DEEP_SLEEP_RATIO__LIMIT", "inf")
    with pytest.raises(ConfigError, match="ratio.limit: expected a finite number such as 0.5, got inf"):
        load(assemble({"alpha": AlphaConfig, "ratio": RatioConfig}))


@pytest.mark.parametrize(("variable", "text", "message"), [
    ("DEEP_SLEEP_LLM__ENABLED", "yes", "llm.enabled: environment variable DEEP_SLEEP_LLM__ENABLED='yes' is not true or false"),
    ("DEEP_SLEEP_ALPHA__ENABLED", "1", "alpha.enabled: environment variable DEEP_SLEEP_ALPHA__ENABLED='1' is not true or false"),
    ("DEEP_SLEEP_ALPHA__SIZE", "3.0", "alpha.size: environment variable DEEP_SLEEP_ALPHA__SIZE='3.0' is not an integer such as 3"),
    ("DEEP_SLEEP_RATIO__SHARE", "half", "ratio.share: environment variable DEEP_SLEEP_RATIO__SHARE='half' is not a number such as 0.5"),
    ("DEEP_SLEEP_RATIO__SHARE", "nan", "ratio.share: environment variable DEEP_SLEEP_RATIO__SHARE='nan' is not a number such as 0.5"),
    ("DEEP_SLEEP_LOOKBACK_HOURS", "", "lookback_hours: environment variable DEEP_SLEEP_LOOKBACK_HOURS='' is not a number such as 0.5"),
])
def test_environment_values_that_are_not_their_type_name_the_variable(monkeypatch, variable, text, message):
    monkeypatch.delenv("DEEP_SLEEP_CONFIG", raising=False)
    monkeypatch.setenv(variable, text)
    with pytest.raises(ConfigError) as caught:
        load(assemble({"alpha": AlphaConfig, "ratio": RatioConfig}))
    assert str(caught.value) == f"invalid configuration: {message} (write it as TOML would)"

"""One typed config object from file + environment, with errors that name the key."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import pytest

from aryl_common.config import ConfigError, RenamedConfigKey, env_var_names
from scheduler_service.config import HaConfig, SchedulerConfig, load_config
from scheduler_service.core.demand_forecast import ForecastSettings


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in env_var_names(SchedulerConfig) | {"ARYL_CONFIG"}:
        monkeypatch.delenv(name, raising=False)


def test_defaults_use_the_embedded_sqlite_database() -> None:
    config = load_config()
    assert config.database.url.startswith("sqlite:///")
    assert config.scheduling.policy == "aryl"


def test_file_then_environment_precedence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "aryl.toml"
    path.write_text('[server]\nlisten = "0.0.0.0:6000"\n[scheduling]\ncycle_interval_s = 9\n')
    monkeypatch.setenv("ARYL_SCHEDULING__CYCLE_INTERVAL_S", "3.5")
    config = load_config(path)
    assert config.server.listen == "0.0.0.0:6000"  # from the file
    assert config.scheduling.cycle_interval_s == 3.5  # the environment wins
    monkeypatch.setenv("ARYL_CONFIG", str(path))
    assert load_config().server.listen == "0.0.0.0:6000"


def test_yaml_files_work(tmp_path: Path) -> None:
    path = tmp_path / "aryl.yaml"
    path.write_text("logging:\n  format: json\n")
    assert load_config(path).logging.format == "json"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[server]\nlisten_port = 1\n", "server.listen_port"),
        ("[agents]\nlost_after_s = -1\n", "agents.lost_after_s"),
        ("[logging]\nformat = 'xml'\n", "logging.format"),
        ("nonsense = [", "not valid toml"),
        ("[demand_forecast]\nbin_s = 0\n", "demand_forecast.bin_s"),
        ("[demand_forecast]\nhistory_s = 3600\n", "demand_forecast.history_s"),
        ("[server]\ndesired_state_port = -2\n", "server.desired_state_port"),
        ("[server]\nlisten = '0.0.0.0:50051'\ndesired_state_port = 50051\n",
         re.escape("server.desired_state_port (50051) must differ from server.listen's port")),
        ("[ha]\nreplica_stale_s = -1\n", "ha.replica_stale_s"),
        ("[ha]\nrenew_s = 2\nreplica_stale_s = 3\n",
         re.escape("ha.renew_s (2) must be at most half of ha.replica_stale_s (3)")),
    ],
)
def test_bad_files_name_the_key(tmp_path: Path, text: str, expected: str) -> None:
    path = tmp_path / "aryl.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=expected):
        load_config(path)


def test_a_replica_goes_stale_after_the_lease_unless_told_otherwise() -> None:
    assert HaConfig().replica_stale_after_s == HaConfig().lease_s == 8.0
    assert HaConfig(lease_s=20, renew_s=5).replica_stale_after_s == 20  # a longer renewal needs no setting of its own
    assert HaConfig(replica_stale_s=4).replica_stale_after_s == 4


def test_bad_environment_value_names_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ARYL_SERVER__WORKER_THREADS", "zero")
    with pytest.raises(ConfigError, match=re.escape("server.worker_threads")):
        load_config()


def test_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(tmp_path / "absent.toml")


def test_demand_forecast_settings_reach_the_forecaster(tmp_path: Path) -> None:
    """Defaults are the forecaster's own; a file's short bins (tests, the demo) reach ``ForecastSettings``."""
    assert load_config().demand_forecast.settings() == ForecastSettings()
    path = tmp_path / "aryl.toml"
    path.write_text("[demand_forecast]\nbin_s = 1\ntrend_window_s = 20\n")
    assert load_config(path).demand_forecast.settings() == ForecastSettings(bin_s=1, trend_window_s=20)


def test_a_renamed_key_is_still_read_under_its_old_name_with_a_warning(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``events.prune_batch`` became ``events.prune_chunk`` (issue 32): a user's file or environment that
    still says the old name keeps its setting, and is told the new name; both names at once are refused."""
    path = tmp_path / "aryl.toml"
    path.write_text("[events]\nprune_batch = 7\nretention_days = 9\n")
    with pytest.warns(RenamedConfigKey, match=re.escape("events.prune_batch is now events.prune_chunk")):
        config = load_config(path)
    assert (config.events.prune_chunk, config.events.retention_days) == (7, 9)
    monkeypatch.setenv("ARYL_EVENTS__PRUNE_BATCH", "11")
    with pytest.warns(RenamedConfigKey):
        assert load_config().events.prune_chunk == 11  # the environment, as the file
    path.write_text("[events]\nprune_batch = 7\nprune_chunk = 8\n")
    monkeypatch.delenv("ARYL_EVENTS__PRUNE_BATCH")
    with pytest.raises(ConfigError, match=re.escape("events.prune_batch and events.prune_chunk are both set")):
        load_config(path)
    path.write_text("[events]\nprune_chunk = 8\n")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert load_config(path).events.prune_chunk == 8  # the new name: no warning

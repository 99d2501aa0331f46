"""The base of every Aryl program's typed configuration (scheduler, agent, router): a file (TOML or
YAML) plus the environment, validated into one frozen object at start-up.

Precedence, highest first: command-line flags (``apply_overrides``), environment variables, the
config file, the defaults. Environment variables are ``ARYL_<SECTION>__<KEY>`` (e.g.
``ARYL_DATABASE__URL``), and only those: a variable naming a whole section (``ARYL_SERVER``) is not
a daemon setting and is ignored, because ``ARYL_SERVER`` is the clients' scheduler address
(``arylctl``), exported in the same shells that start daemons. The file is named by ``--config``
or ``ARYL_CONFIG``. Unknown keys are errors, so a typo never silently falls back to a default. A key
that was renamed is still read under its old name, from the file and the environment alike, with a
``RenamedConfigKey`` warning naming the new one (``ArylSettings.renamed_keys``): a user's config never
breaks, nor silently loses a setting, because a name changed. Each program declares its own sections
(``scheduler_service.config``, ``node_agent.config``, ``inference_router.config``); nothing else in a
program reads the environment.
"""

from __future__ import annotations

import os
import tomllib
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar, Literal, TypeGuard, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, EnvSettingsSource, PydanticBaseSettingsSource, SettingsConfigDict

from aryl_common.entry import BadInput

ENV_PREFIX = "ARYL_"
ENV_NESTED_DELIMITER = "__"
T = TypeVar("T", bound="BaseSettings")


class ConfigError(BadInput):
    """The configuration file or environment is invalid; the message says which key and why (exit 2)."""


class RenamedConfigKey(FutureWarning):
    """A config key was given under its old name (``ArylSettings.renamed_keys``); it still works."""


class ConfigSection(BaseModel):
    """One section of a config: unknown keys are errors, values never change after start-up."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class SectionKeyEnvSource(EnvSettingsSource):
    """The environment, read as ``ARYL_<SECTION>__<KEY>`` variables only: the whole-section form
    pydantic-settings also accepts (``ARYL_SERVER='{"listen": ...}'``) is ignored, so a client's
    ``ARYL_SERVER=host:port`` in the same shell never reaches, let alone breaks, a daemon's
    ``[server]`` section."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        value, key, is_complex = super().get_field_value(field, field_name)
        if _is_section(field.annotation):
            return None, key, is_complex  # its keys still come in through ARYL_<SECTION>__<KEY>
        return value, key, is_complex


def _is_section(annotation: object) -> TypeGuard[type[BaseModel]]:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


class ArylSettings(BaseSettings):
    """Base of every Aryl program's config (scheduler, agent, router): ``ARYL_<SECTION>__<KEY>``
    variables override the file's values (passed as init values), which override the defaults."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, env_nested_delimiter=ENV_NESTED_DELIMITER, extra="forbid", frozen=True
    )

    # Keys renamed, "section.old" -> "section.new" (same section): the old name is still read, with a
    # RenamedConfigKey warning; both names at once are an error, since which one was meant is unknown.
    renamed_keys: ClassVar[Mapping[str, str]] = {}

    @model_validator(mode="before")
    @classmethod
    def _read_renamed_keys(cls, data: Any) -> Any:
        if not cls.renamed_keys or not isinstance(data, Mapping):
            return data
        data = dict(data)
        for old, new in cls.renamed_keys.items():
            section, old_key = old.split(".")
            _, new_key = new.split(".")
            given = data.get(section)
            if not isinstance(given, Mapping) or old_key not in given:
                continue
            if new_key in given:
                raise ValueError(f"{old} and {new} are both set; {old} is the old name of {new}: keep {new} only")
            # Told as where the setting came from, the configuration, not a line of pydantic's.
            warnings.warn_explicit(f"config key {old} is now {new}; the old name still works, but may not for long",
                                   RenamedConfigKey, filename="configuration", lineno=0, module=__name__)
            data[section] = {(new_key if key == old_key else key): value for key, value in given.items()}
        return data

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (SectionKeyEnvSource(settings_cls), init_settings)


class LoggingConfig(ConfigSection):
    """The ``[logging]`` section every program has (``aryl_common.logs.configure_logging``)."""

    format: Literal["console", "json"] = "console"
    level: Literal["debug", "info", "warning", "error"] = "info"


def read_config_file(path: str | os.PathLike[str] | None) -> dict[str, Any]:
    """Parse a TOML (``.toml``) or YAML (anything else) config file into a dict."""
    if path is None:
        return {}
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read config file {p}: {exc.strerror}") from exc
    try:
        data = tomllib.loads(text) if p.suffix == ".toml" else yaml.safe_load(text)
    except (tomllib.TOMLDecodeError, yaml.YAMLError) as exc:
        raise ConfigError(f"config file {p} is not valid {p.suffix.lstrip('.') or 'YAML'}: {exc}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {p} must hold a mapping of sections, not {type(data).__name__}")
    return data


def load_settings(cls: type[T], path: str | os.PathLike[str] | None = None) -> T:
    """Build ``cls`` from ``path`` (or ``$ARYL_CONFIG``) and the environment; ConfigError on bad input."""
    path = path if path is not None else os.environ.get(f"{ENV_PREFIX}CONFIG") or None
    try:
        return cls(**read_config_file(path))
    except ValidationError as exc:
        problems = "; ".join(  # a rule of the whole config (no key: renamed_keys) is its message alone
            f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" if err["loc"] else err["msg"]
            for err in exc.errors()
        )
        raise ConfigError(f"invalid configuration: {problems}") from exc


def apply_overrides(config: T, overrides: dict[str, dict[str, Any]]) -> T:
    """``config`` with ``{section: {key: value}}`` laid over it, validated; ConfigError on bad values.

    Used for command-line flags, which must beat the environment: rebuilding a settings object
    would let ``ARYL_*`` variables win again, so each touched section is re-validated on its own.
    ``None`` values (flags not given) are ignored.
    """
    updates: dict[str, BaseModel] = {}
    for section, values in overrides.items():
        given = {k: v for k, v in values.items() if v is not None}
        current = getattr(config, section, None)
        if not isinstance(current, BaseModel):
            raise ConfigError(f"unknown configuration section {section!r}")
        if not given:
            continue
        try:
            updates[section] = type(current).model_validate({**current.model_dump(), **given})
        except ValidationError as exc:
            problems = "; ".join(
                f"{section}.{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in exc.errors()
            )
            raise ConfigError(f"invalid command-line option: {problems}") from exc
    return config.model_copy(update=updates)


def env_var_names(cls: type[BaseSettings]) -> set[str]:
    """Every ``ARYL_SECTION__KEY`` variable ``cls`` understands (for docs and the compose check)."""
    names: set[str] = set()
    for section, field in cls.model_fields.items():
        sub = field.annotation
        if _is_section(sub):
            names.update(
                f"{ENV_PREFIX}{section.upper()}{ENV_NESTED_DELIMITER}{key.upper()}" for key in sub.model_fields
            )
        else:
            names.add(f"{ENV_PREFIX}{section.upper()}")
    return names

"""great-expectations suite specs for every data-stage output (see ``docs/data-contracts.md``).

A :class:`Spec` is plain data: the contract's columns with their types, which may be null,
value checks (``in_set``, ``between``, ``unique``, ``regex``) and *derived* columns — invariants
computed with polars (``alternates``, ``system_only_first``, ``leaks``, …) that the suite then
expects to hold. :func:`prepare` adds the derived columns to a polars frame and converts it to
pandas once; :func:`build_suite` turns the spec into ``gx.expectations.*`` objects.
great-expectations is imported lazily (it is slow to import), so specs can be inspected cheaply.

Nested columns (``list[...]``) are checked on their polars dtype (a derived ``<col>:dtype``
column) and handed to great-expectations as their list length, so that null checks still apply
but no Python objects are built per message.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping

import polars as pl

from mimesis_lab.config import Params
from mimesis_lab.envs.gyms.registry import ALL_GYMS

ROLES = ("system", "user", "assistant")
BEHAVIOR_IDS = tuple(f"B{i}" for i in range(1, 14)) + ("N",)
ANNOTATORS = ("rule", "openai")
GYM_SOURCES = tuple(f"interact_{g}" for g in ALL_GYMS)
GYM_SPLITS = ("train", "val", "test")
THINK_RE = r"(?s)^<think>.*</think>"

MESSAGES = pl.List(pl.Struct({"role": pl.String, "content": pl.String}))
TURNS = pl.List(pl.Struct({
    "role": pl.String, "content": pl.String, "reasons": pl.List(pl.String), "reactions": pl.List(pl.String),
}))
INT_INDICES = pl.List(pl.Int64)

# pandas dtype names accepted for the "int"/"float" column types (any width).
ANY_INT = ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"]
ANY_FLOAT = ["float32", "float64"]

Env = Mapping[str, Any]
Compute = Callable[[pl.DataFrame, Env], "pl.Expr | pl.Series"]


class Skip(Exception):
    """A derived column that cannot apply here (e.g. its cross-file input is missing)."""


@dataclass(frozen=True)
class Check:
    expectation: str           # great-expectations class name, e.g. "ExpectColumnValuesToBeInSet"
    column: str | None
    kwargs: dict[str, Any] = field(default_factory=dict)
    doc: str = ""


@dataclass(frozen=True)
class Derived:
    name: str
    compute: pl.Expr | Compute
    expect: tuple | None = (True,)   # the value set the column must lie in; None = shown only
    doc: str = ""
    show: Mapping[str, pl.Expr] = field(default_factory=dict)  # evaluated on failing rows, for the report


@dataclass(frozen=True)
class Spec:
    name: str
    columns: Mapping[str, Any]       # "str" | "int64" | "bool" | "int" | "float" | a nested polars dtype
    nullable: frozenset[str] = frozenset()
    exact: bool = True               # the column set must match exactly (else: at least these)
    key: tuple[str, ...] = ()        # columns that identify a row in the report
    min_rows: int = 0
    checks: tuple[Check, ...] = ()
    derived: tuple[Derived, ...] = ()
    flatten_messages: bool = False   # also validate the flattened `messages` as "<name>.messages"


# --- small constructors that keep the specs readable -------------------------------------------

def in_set(col: str, values, doc: str = "") -> Check:
    return Check("ExpectColumnValuesToBeInSet", col, {"value_set": list(values)}, doc)


def between(col: str, lo=None, hi=None, doc: str = "") -> Check:
    return Check("ExpectColumnValuesToBeBetween", col, {"min_value": lo, "max_value": hi}, doc)


def unique(col: str, doc: str = "") -> Check:
    return Check("ExpectColumnValuesToBeUnique", col, {}, doc)


def regex(col: str, pattern: str, doc: str = "") -> Check:
    return Check("ExpectColumnValuesToMatchRegex", col, {"regex": pattern}, doc)


# --- polars expressions behind the derived columns --------------------------------------------

def _roles(col: str = "messages") -> pl.Expr:
    return pl.col(col).list.eval(pl.element().struct.field("role"))


def _alternating(first: str, second: str) -> pl.Expr:
    """Inside ``list.eval``: element i is ``first`` for even i, ``second`` for odd i."""
    expected = pl.when(pl.int_range(pl.len()) % 2 == 0).then(pl.lit(first)).otherwise(pl.lit(second))
    return (pl.element() == expected).all()


ROLES_SHOWN = {"roles": _roles().list.join(",")}

FIRST_ROLE = Derived("first_role", _roles().list.first().fill_null("<none>"), ("system",),
                     "the first message is the system message", ROLES_SHOWN)
SYSTEM_ONLY_FIRST = Derived(
    "system_only_first",
    _roles().list.eval(((pl.element() == "system") & (pl.int_range(pl.len()) > 0)).any()).list.first().not_(),
    doc="a system message occurs only at position 0", show=ROLES_SHOWN,
)
ALTERNATES = Derived(
    "alternates",
    pl.when(_roles().list.first() == "system").then(_roles().list.slice(1)).otherwise(_roles())
    .list.eval(_alternating("assistant", "user") | _alternating("user", "assistant")).list.first(),
    doc="messages after the system message alternate assistant/user (the partner may open: a support agent's "
        "greeting)", show=ROLES_SHOWN,
)
ASSISTANT_THINKS = Derived(
    "assistant_thinks",
    pl.col("messages").list.eval(
        pl.when(pl.element().struct.field("role") == "assistant")
        .then(pl.element().struct.field("content").str.contains(THINK_RE).fill_null(False))
        .otherwise(True)
    ).list.all(),
    doc="every assistant message starts with a <think>…</think> block",
    show={"first_bad_assistant": pl.col("messages").list.eval(
        pl.element().struct.field("content").filter(
            (pl.element().struct.field("role") == "assistant")
            & ~pl.element().struct.field("content").str.contains(THINK_RE).fill_null(False)
        ).str.slice(0, 80)).list.first()},
)
N_MESSAGES_MATCH = Derived("n_messages_matches", pl.col("n_messages") == pl.col("messages").list.len(),
                           doc="n_messages == len(messages)")
N_TARGET_MATCH = Derived("n_target_turns_matches",
                         pl.col("n_target_turns") == _roles().list.count_matches("assistant"),
                         doc="n_target_turns == number of assistant messages", show=ROLES_SHOWN)


def _json_ok(col: str, kind: type | None = None) -> Compute:
    def compute(df: pl.DataFrame, env: Env) -> pl.Series:
        out = []
        for v in df.get_column(col).to_list():
            try:
                out.append(kind is None or isinstance(json.loads(v), kind))
            except (TypeError, ValueError):
                out.append(False)
        return pl.Series(out, dtype=pl.Boolean)
    return compute


def _behavior_ids_known(df: pl.DataFrame, env: Env) -> pl.Series:
    out = []
    for v in df.get_column("behavior_ids").to_list():
        try:
            ids = json.loads(v)
            out.append(isinstance(ids, list) and all(i in BEHAVIOR_IDS for i in ids))
        except (TypeError, ValueError):
            out.append(False)
    return pl.Series(out, dtype=pl.Boolean)


def _tt_turns(env: Env) -> pl.DataFrame:
    tt = env.get("thoughttrace_turns")
    if tt is None:
        raise Skip("thoughttrace output not available")
    return tt


def _conversation_known(df: pl.DataFrame, env: Env) -> pl.Expr:
    return pl.col("conversation_id").is_in(_tt_turns(env).get_column("conversation_id").implode())


def _turns_in_range(df: pl.DataFrame, env: Env) -> pl.Series:
    n = (df.select(pl.col("conversation_id"), pl.col("turns"))
         .join(_tt_turns(env), on="conversation_id", how="left", maintain_order="left"))
    return n.select(
        pl.col("turns").list.eval((pl.element() >= 0)).list.all()
        & (pl.col("turns").list.max().fill_null(-1) < pl.col("n_turns"))
    ).to_series()


def _leak_keys(df: pl.DataFrame) -> pl.Expr:
    parts = [pl.lit(prefix) + pl.col(col).cast(pl.String)
             for prefix, col in (("user:", "user_id"), ("conv:", "conversation_id"), ("scenario:", "scenario_key"))
             if col in df.columns]
    return pl.concat_list(parts) if parts else pl.lit([], dtype=pl.List(pl.String))


def _leaked(df: pl.DataFrame, env: Env) -> pl.Expr:
    leaked = env.get("leaked_keys")
    if leaked is None:
        raise Skip("split leakage table not available")
    return _leak_keys(df).list.eval(pl.element().filter(pl.element().is_in(leaked.implode())))


LEAKS = Derived(
    "leaks", lambda df, env: _leaked(df, env).list.len().cast(pl.Int64), (0,),
    "no user_id/conversation_id/scenario_key of this row occurs in another split (of any dataset)",
    show={"leaked_keys": pl.col("leaked_keys")},
)
LEAKED_KEYS = Derived("leaked_keys", lambda df, env: _leaked(df, env).list.join(", "), None)


def leaked_keys(key_frames: list[tuple[str, pl.DataFrame]]) -> pl.Series:
    """Keys (``user:…``, ``conv:…``, ``scenario:…``) that occur in more than one split.

    ``key_frames`` holds ``(split, frame)`` pairs; the frames need only the key columns.
    """
    parts = [df.select(_leak_keys(df).alias("key")).explode("key").drop_nulls().unique()
             .with_columns(pl.lit(split).alias("split")) for split, df in key_frames]
    if not parts:
        return pl.Series("key", [], dtype=pl.String)
    keys = pl.concat(parts)
    return keys.group_by("key").agg(pl.col("split").n_unique().alias("n")).filter(pl.col("n") > 1).get_column("key")


def _metric_gap(metric: str, env_key: str) -> Compute:
    def compute(df: pl.DataFrame, env: Env) -> pl.Expr:
        if env.get(env_key) is None:
            raise Skip(f"{env_key} not available")
        return (pl.col(metric) - pl.lit(int(env[env_key]))).cast(pl.Int64)
    return compute


# --- the specs ----------------------------------------------------------------------------------

def role_swap_spec(params: Params) -> Spec:
    no_swap = list(params.role_swap.no_swap_sources)
    return Spec(
        name="role_swap",
        columns={"conversation_id": "str", "user_id": "str", "source": "str", "source_file": "str",
                 "row": "int64", "swap": "bool", "copies": "int64", "messages": MESSAGES,
                 "n_messages": "int64", "n_target_turns": "int64", "model": "str", "language": "str"},
        nullable=frozenset({"model", "language"}),
        key=("conversation_id",),
        min_rows=1,
        checks=(unique("conversation_id"), between("row", 1), between("copies", 0),
                between("n_target_turns", 1), between("n_messages", 1)),
        derived=(
            SYSTEM_ONLY_FIRST, N_MESSAGES_MATCH, N_TARGET_MATCH,
            Derived("swap_matches_source", pl.col("swap") == ~pl.col("source").is_in(no_swap),
                    doc=f"swap is false exactly for no_swap_sources {no_swap}", show={"source": pl.col("source")}),
        ),
        flatten_messages=True,
    )


def thoughttrace_spec(params: Params) -> Spec:
    turn_roles = _roles("turns")
    return Spec(
        name="thoughttrace",
        columns={"conversation_id": "str", "user_id": "str", "task_id": "str", "model_name": "str",
                 "source_file": "str", "row": "int64", "system_prompt": "str", "messages": MESSAGES,
                 "turns": TURNS, "n_messages": "int64", "n_target_turns": "int64",
                 "n_turns_without_reasons": "int64", "include_reactions": "bool"},
        nullable=frozenset({"model_name"}),
        key=("conversation_id",),
        min_rows=1,
        checks=(unique("conversation_id"), between("row", 1), between("n_target_turns", 1),
                between("n_turns_without_reasons", 0),
                in_set("include_reactions", [params.thoughttrace.include_reactions],
                       "matches params thoughttrace.include_reactions")),
        derived=(
            FIRST_ROLE, ALTERNATES, ASSISTANT_THINKS, N_MESSAGES_MATCH, N_TARGET_MATCH,
            Derived("ids_consistent",
                    pl.col("conversation_id").str.starts_with(pl.col("user_id") + "_" + pl.col("task_id") + "_"),
                    doc="conversation_id is <user_id>_<task_id>_…",
                    show={"user_id": pl.col("user_id"), "task_id": pl.col("task_id")}),
            Derived("turn_roles_valid", turn_roles.list.eval(pl.element().is_in(["user", "assistant"]).all())
                    .list.first(), doc="original turn roles are user/assistant",
                    show={"turn_roles": turn_roles.list.join(",")}),
            Derived("messages_mirror_turns",
                    _roles().list.slice(1) == turn_roles.list.eval(
                        pl.when(pl.element() == "user").then(pl.lit("assistant")).otherwise(pl.lit("user"))),
                    doc="messages[1:] are the turns with user/assistant swapped",
                    show={"roles": _roles().list.join(","), "turn_roles": turn_roles.list.join(",")}),
        ),
        flatten_messages=True,
    )


def behavior_annotations_spec(params: Params) -> Spec:
    return Spec(
        name="behavior_annotations",
        columns={"conversation_id": "str", "user_id": "str", "behavior": "str", "turns": INT_INDICES,
                 "quote": "str", "severity": "int64", "rationale": "str", "annotator": "str"},
        nullable=frozenset({"quote", "rationale"}),
        key=("conversation_id", "behavior"),
        checks=(in_set("behavior", BEHAVIOR_IDS), between("severity", 1, 3), in_set("annotator", ANNOTATORS)),
        derived=(
            Derived("conversation_known", _conversation_known,
                    doc="conversation_id is a thoughttrace conversation"),
            Derived("turns_in_range", _turns_in_range,
                    doc="turn indices are 0-based indices into the conversation's turns",
                    show={"turns": pl.col("turns").cast(pl.List(pl.String)).list.join(",")}),
        ),
    )


def behavior_frequencies_spec(params: Params) -> Spec:
    return Spec(
        name="behavior_frequencies",
        columns={"behavior": "str", "name": "str", "count": "int", "share": "float"},
        key=("behavior",),
        min_rows=1,
        checks=(unique("behavior"), in_set("behavior", BEHAVIOR_IDS), between("count", 0), between("share", 0, 1)),
    )


def behavior_tasks_spec(params: Params) -> Spec:
    return Spec(
        name="behavior_tasks",
        columns={"task_id": "str", "conversation_id": "str", "user_id": "str", "scenario_key": "str",
                 "scenario": "str", "behavior_ids": "str", "kwargs": "str", "flow": "str", "subflow": "str",
                 "turn_budget": "int64", "data_source": "str", "needs_trace": "bool", "abcd_split": "str"},
        nullable=frozenset({"abcd_split"}),
        key=("task_id",),
        min_rows=1,
        checks=(unique("task_id"), in_set("data_source", ["usersim_behavior"]), between("turn_budget", 1)),
        derived=(
            Derived("scenario_is_json", _json_ok("scenario"), doc="scenario parses as JSON",
                    show={"scenario": pl.col("scenario").str.slice(0, 80)}),
            Derived("kwargs_is_json", _json_ok("kwargs", dict), doc="kwargs parses as a JSON object",
                    show={"kwargs": pl.col("kwargs").str.slice(0, 80)}),
            Derived("behavior_ids_is_json", _json_ok("behavior_ids", list), doc="behavior_ids parses as a JSON list",
                    show={"behavior_ids": pl.col("behavior_ids")}),
            Derived("behavior_ids_known", _behavior_ids_known, doc=f"behavior_ids ⊆ {{{', '.join(BEHAVIOR_IDS)}}}",
                    show={"behavior_ids": pl.col("behavior_ids")}),
        ),
    )


DATASET_SPECS: dict[str, Callable[[Params], Spec]] = {
    "role_swap": role_swap_spec,
    "thoughttrace": thoughttrace_spec,
    "behavior_tasks": behavior_tasks_spec,
    "behavior_annotations": behavior_annotations_spec,
    "behavior_frequencies": behavior_frequencies_spec,
}


def _in_dataset(df: pl.DataFrame, env: Env) -> pl.Expr:
    ids = env.get("dataset_ids")
    if ids is None:
        raise Skip("the dataset's output is not available")
    return pl.col(ids.name).is_in(ids.implode())


def split_spec(params: Params, dataset: str, split: str) -> Spec:
    """The dataset's spec plus ``split`` (== the file's split), ``in_dataset`` and the leakage check.

    The flattened messages are validated once, on the dataset; ``in_dataset`` ties each split row
    to a dataset row (by the dataset's key).
    """
    base = DATASET_SPECS[dataset](params) if dataset in DATASET_SPECS else Spec(
        name=dataset, columns={"conversation_id": "str", "user_id": "str"}, exact=False, key=("conversation_id",))
    in_dataset = Derived("in_dataset", _in_dataset, doc=f"the row's {base.key[0]} occurs in the {dataset} output")
    return replace(
        base,
        name=f"splits/{dataset}/{split}",
        columns={**base.columns, "split": "str"},
        min_rows=0,
        checks=base.checks + (in_set("split", [split], "the split column equals the file's split"),),
        derived=base.derived + (in_dataset, LEAKED_KEYS, LEAKS),
        flatten_messages=False,
    )


# --- gyms: the UserRL rows of the agent gyms -------------------------------------------------------

def _json_at_equals(col: str, path: tuple[str, ...], target: str) -> Compute:
    """``json.loads(col)[path…]`` exists and equals the ``target`` column (as a string)."""
    def compute(df: pl.DataFrame, env: Env) -> pl.Series:
        out = []
        for v, want in zip(df.get_column(col).to_list(), df.get_column(target).to_list()):
            try:
                x = json.loads(v)
                for key in path:
                    x = x[key]
                out.append(x is not None and not isinstance(x, (dict, list)) and str(x) == want)
            except (TypeError, ValueError, KeyError, IndexError):
                out.append(False)
        return pl.Series(out, dtype=pl.Boolean)
    return compute


def _task_key() -> pl.Expr:
    return pl.col("data_source").cast(pl.String) + pl.lit(":") + pl.col("task_id").cast(pl.String)


def _gym_leaked(df: pl.DataFrame, env: Env) -> pl.Expr:
    leaked = env.get("gym_leaked_keys")
    if leaked is None:
        raise Skip("the gyms split files are not all available")
    return _task_key().is_in(leaked.implode()).fill_null(False)


def gym_leaked_keys(key_frames: list[tuple[str, pl.DataFrame]]) -> pl.Series:
    """``data_source:task_id`` keys that occur in more than one split (frames need those two columns)."""
    parts = [df.select(_task_key().alias("key")).drop_nulls().unique().with_columns(pl.lit(split).alias("split"))
             for split, df in key_frames]
    if not parts:
        return pl.Series("key", [], dtype=pl.String)
    keys = pl.concat(parts)
    return keys.group_by("key").agg(pl.col("split").n_unique().alias("n")).filter(pl.col("n") > 1).get_column("key")


def gyms_spec(params: Params, split: str) -> Spec:
    """``<gyms.output_dir>/<split>.parquet``: UserRL rows; training gyms only in train/val, held-out only in test."""
    g = params.gyms
    held_out = list(g.held_out_gyms)
    allowed = list(g.train_gyms) if split in ("train", "val") else held_out
    where = "training gyms (gyms.train_gyms)" if split in ("train", "val") else f"held-out gyms {held_out}"
    may_hold = list(allowed)
    if split == "test" and g.userrl_rows:   # UserRL's own test rows of the training gyms stay in test
        may_hold += list(g.train_gyms)
        where += " and UserRL's test rows of the training gyms"
    extra_info_shown = {"extra_info": pl.col("extra_info").str.slice(0, 120)}
    checks = (
        in_set("data_source", GYM_SOURCES, "one of the eight interact_<gym> sources"),
        in_set("gym", ALL_GYMS),
        in_set("split", [split], "the split column equals the file's split"),
        in_set("ability", ["interaction"]),
        unique("task_key", "no (data_source, task_id) twice in this split"),
    )
    if allowed and not g.userrl_rows:
        # with UserRL's rows a gym may have none (none published, or all quarantined: metrics/gyms.json names
        # them in gyms_without_rows, with the reasons); without them every gym's task file gives rows
        checks += (Check("ExpectColumnDistinctValuesToContainSet", "gym", {"value_set": allowed},
                         f"every one of the {where} has >= 1 task in {split}"),)
    return Spec(
        name=f"gyms/{split}",
        columns={"data_source": "str", "gym": "str", "task_id": "str", "split": "str", "prompt": MESSAGES,
                 "ability": "str", "reward_model": "str", "extra_info": "str"},
        key=("data_source", "task_id"),
        min_rows=1 if allowed else 0,
        checks=checks,
        derived=(
            Derived("task_key", _task_key(), None, "data_source:task_id"),
            Derived("gym_matches_source", (pl.col("data_source") == pl.lit("interact_") + pl.col("gym")),
                    doc="data_source == interact_<gym>", show={"gym": pl.col("gym")}),
            Derived("gym_allowed_in_split", pl.col("gym").is_in(may_hold),
                    doc=f"{split} holds only {where}" + ("; no held-out gym" if split != "test" else ""),
                    show={"gym": pl.col("gym")}),
            Derived("prompt_nonempty", pl.col("prompt").list.len() > 0, doc="the prompt has >= 1 message"),
            Derived("prompt_roles_valid", _roles("prompt").list.eval(pl.element().is_in(list(ROLES)).all())
                    .list.first().fill_null(False), doc=f"prompt roles are in {list(ROLES)}",
                    show={"roles": _roles("prompt").list.join(",")}),
            Derived("reward_model_is_object", _json_ok("reward_model", dict),
                    doc="reward_model parses as a JSON object", show={"reward_model": pl.col("reward_model")
                                                                      .str.slice(0, 120)}),
            Derived("extra_info_is_object", _json_ok("extra_info", dict),
                    doc="extra_info parses as a JSON object", show=extra_info_shown),
            Derived("create_kwargs_id_matches",
                    _json_at_equals("extra_info", ("tools_kwargs", "interact_with_env", "create_kwargs", "id"),
                                    "task_id"),
                    doc="extra_info.tools_kwargs.interact_with_env.create_kwargs.id == task_id",
                    show=extra_info_shown),
            Derived("extra_info_split_matches", _json_at_equals("extra_info", ("split",), "split"),
                    doc="extra_info.split == split", show=extra_info_shown),
            Derived("in_two_splits", _gym_leaked, (False,),
                    "no (data_source, task_id) of this row occurs in another gyms split"),
        ),
    )


AGENT_ROLES = ("system", "user", "assistant", "tool")
AGENT_REPLY_RE = r"(?s)^\[(action|answer|search)\] \S"


def agent_traces_spec(params: Params, split: str) -> Spec:
    """``<agent_traces.output_dir>/<split>.parquet``: rewarded expert traces of the training gyms, one
    ``oracle`` trace per task and ``exploratory`` ones (each with its task's oracle trace)."""
    train_gyms = list(params.gyms.train_gyms)
    replies = pl.col("messages").list.eval(
        pl.when(pl.element().struct.field("role") == "assistant").then(pl.element().struct.field("content")))
    replies = replies.list.drop_nulls()
    return Spec(
        name=f"agent_traces/{split}",
        columns={"data_source": "str", "gym": "str", "task_id": "str", "split": "str", "kind": "str", "seed": "int64",
                 "messages": MESSAGES, "turn_rewards": pl.List(pl.Float64), "total_reward": "float", "n_turns": "int64",
                 "user_turns": "int64"},
        key=("data_source", "task_id", "kind", "seed"),
        min_rows=1 if split == "train" else 0,
        checks=(
            in_set("gym", train_gyms, "traces come from the training gyms only"),
            in_set("split", [split], "the split column equals the file's split"),
            in_set("kind", ["oracle", "exploratory", "coached"], "a trace is the expert's best play, an exploratory "
                   "one, or a coached copy of one of them"),
            between("total_reward", 0, None, "rewards are non-negative"),
            between("n_turns", 1, None, "at least one agent turn"),
            between("user_turns", 0, None, "agent turns addressed to the user (a count)"),
            unique("trace_key", "one trace per (data_source, task_id, kind, seed), a coached copy per cut turn too"),
        ),
        derived=(
            Derived("trace_key", _task_key() + pl.lit(":") + pl.col("kind") + pl.lit(":")
                    + pl.col("seed").cast(pl.String)
                    + pl.when(pl.col("kind") == "coached").then(pl.lit(":") + pl.col("n_turns").cast(pl.String))
                    .otherwise(pl.lit("")), None, "data_source:task_id:kind:seed[:n_turns of a coached copy]"),
            Derived("rewarded", (pl.col("kind") == "coached") | (pl.col("total_reward") > 0),
                    doc="only traces the gym rewarded (total reward > 0; a coached copy is a prefix of one)"),
            Derived("one_oracle_per_task", (pl.col("kind") != "oracle")
                    | (pl.col("kind").eq("oracle").cast(pl.Int64).sum().over(_task_key()) == 1),
                    doc="one oracle trace per (data_source, task_id)"),
            Derived("exploratory_has_oracle", (pl.col("kind") != "exploratory")
                    | (pl.col("kind").eq("oracle").cast(pl.Int64).sum().over(_task_key()) >= 1),
                    doc="every exploratory trace's task has its oracle trace in the same split"),
            Derived("coached_has_oracle", (pl.col("kind") != "coached")
                    | (pl.col("kind").eq("oracle").cast(pl.Int64).sum().over(_task_key()) >= 1),
                    doc="every coached copy's task has its oracle trace in the same split"),
            Derived("coached_note_before_reply", (pl.col("kind") != "coached")
                    | (_roles().list.get(-2, null_on_oob=True) == "user").fill_null(False),
                    doc="a coached copy's last reply follows the coach's note (a user message)", show=ROLES_SHOWN),
            Derived("user_turns_fit", pl.col("user_turns") <= pl.col("n_turns"),
                    doc="user turns are agent turns"),
            Derived("gym_matches_source", (pl.col("data_source") == pl.lit("interact_") + pl.col("gym")),
                    doc="data_source == interact_<gym>", show={"gym": pl.col("gym")}),
            Derived("roles_valid", _roles().list.eval(pl.element().is_in(list(AGENT_ROLES)).all())
                    .list.first().fill_null(False), doc=f"message roles are in {list(AGENT_ROLES)}",
                    show=ROLES_SHOWN),
            Derived("ends_with_agent_reply", _roles().list.last() == "assistant",
                    doc="the trace ends with the agent's final reply", show=ROLES_SHOWN),
            Derived("replies_use_the_tool", replies.list.eval(pl.element().str.contains(AGENT_REPLY_RE).all())
                    .list.first().fill_null(False),
                    doc="every agent reply is `[action|answer|search] content` (the rollout interface)",
                    show={"replies": replies.list.join(" | ").str.slice(0, 160)}),
            Derived("turns_match_rewards", pl.col("turn_rewards").list.len() == pl.col("n_turns"),
                    doc="one reward per agent turn"),
            Derived("replies_match_turns", replies.list.len() == pl.col("n_turns"),
                    doc="one agent reply per turn"),
            Derived("reward_sums", (pl.col("turn_rewards").list.sum() - pl.col("total_reward")).abs() < 1e-9,
                    doc="total_reward == sum(turn_rewards)"),
        ),
    )


def quarantine_spec(stage: str) -> Spec:
    return Spec(
        name=f"quarantine/{stage}",
        columns={"source_file": "str", "row": "int64", "reason": "str", "raw": "str"},
        key=("source_file", "row"),
        checks=(between("row", 1), regex("reason", r"^[^:]+:", "a reason starts with `<kind>:`")),
    )


# Stage metrics that must be 0 (a stage-internal invariant recorded in metrics/<stage>.json).
METRIC_ZEROS: dict[str, tuple[str, ...]] = {"gyms": ("leaked_task_keys",)}


def metrics_spec(stage: str) -> Spec:
    gaps = (
        Derived("accounting_gap", (pl.col("rows_in") - pl.col("rows_out") - pl.col("rows_quarantined")).cast(pl.Int64),
                (0,), "rows_in == rows_out + rows_quarantined"),
        Derived("reasons_gap", (pl.col("quarantine_by_reason_total") - pl.col("rows_quarantined")).cast(pl.Int64),
                (0,), "sum(quarantine_by_reason) == rows_quarantined"),
        Derived("output_rows_gap", _metric_gap("rows_out", "output_rows"), (0,),
                "rows_out == the output's row count"),
        Derived("quarantine_rows_gap", _metric_gap("rows_quarantined", "quarantine_rows"), (0,),
                "rows_quarantined == the quarantine file's row count"),
    )
    cols = ("rows_in", "rows_out", "rows_quarantined", "quarantine_by_reason_total")
    zero = METRIC_ZEROS.get(stage, ())
    return Spec(
        name=f"metrics/{stage}",
        columns={"stage": "str", **{c: "int" for c in cols + zero}},
        key=("stage",),
        min_rows=1,
        checks=tuple(between(c, 0) for c in cols) + tuple(
            between(c, 0, 0, f"{c} == 0 (checked by the stage itself)") for c in zero),
        derived=gaps,
    )


def messages_spec(parent: Spec) -> Spec:
    key = parent.key[0]
    return Spec(
        name=f"{parent.name}.messages",
        columns={key: "str", "position": "int64", "role": "str", "content": "str"},
        key=(key, "position"),
        checks=(in_set("role", ROLES, "roles of the flattened messages"),),
    )


def flatten_messages(df: pl.DataFrame, key: str) -> pl.DataFrame:
    """One row per message: ``<key>``, ``position`` (0-based), ``role``, ``content``."""
    m = pl.col("messages")
    return (
        df.select(
            pl.col(key),
            pl.int_ranges(m.list.len().fill_null(0)).cast(pl.List(pl.Int64)).alias("position"),
            m.list.eval(pl.element().struct.field("role")).alias("role"),
            m.list.eval(pl.element().struct.field("content")).alias("content"),
        )
        .explode(["position", "role", "content"])
        .filter(pl.col("position").is_not_null())
    )


# --- spec -> prepared frame -> great-expectations suite ------------------------------------------

def dtype_repr(dtype: pl.DataType) -> str:
    """A dtype string with struct fields sorted, so field order does not matter."""
    if isinstance(dtype, pl.List):
        return f"list[{dtype_repr(dtype.inner)}]"
    if isinstance(dtype, pl.Struct):
        fields = sorted(dtype.fields, key=lambda f: f.name)
        return "struct{" + ", ".join(f"{f.name}: {dtype_repr(f.dtype)}" for f in fields) + "}"
    return str(dtype)


@dataclass
class Prepared:
    frame: pl.DataFrame                      # the input plus the derived columns (polars)
    pandas: Any                              # what great-expectations sees
    derived: list[str]                       # derived columns that were computed
    errors: dict[str, str]                   # derived column -> why it could not be computed
    skipped: dict[str, str]                  # derived column -> why it does not apply


def prepare(spec: Spec, df: pl.DataFrame, env: Env | None = None) -> Prepared:
    env = env or {}
    nested = [c for c, t in spec.columns.items() if isinstance(t, pl.DataType)]
    frame, done, errors, skipped = df, [], {}, {}
    for d in all_derived(spec):
        try:
            if d.name in df.columns:
                raise ValueError(f"the input already has a column named {d.name!r}")
            value = d.compute if isinstance(d.compute, pl.Expr) else d.compute(frame, env)
            if isinstance(value, pl.Series):
                col = value.alias(d.name)
            else:
                col = frame.with_columns(value.alias(d.name)).get_column(d.name)  # broadcasts literals
            if col.dtype == pl.Boolean:
                col = col.fill_null(False)
            frame = frame.with_columns(col)
            done.append(d.name)
        except Skip as e:
            skipped[d.name] = str(e)
        except Exception as e:  # noqa: BLE001 - a bad input column must become a report entry
            errors[d.name] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    to_pandas = frame.with_columns(
        [pl.col(c).list.len().cast(pl.Int64) for c in nested
         if c in frame.columns and isinstance(frame.schema[c], (pl.List, pl.Array))]
    )
    return Prepared(frame, to_pandas.to_pandas(), done, errors, skipped)


def build_suite(spec: Spec, prepared: Prepared):
    """The great-expectations suite for ``spec`` on an already prepared frame."""
    import great_expectations as gx

    E = gx.expectations
    present = set(prepared.frame.columns)
    exps: list = [E.ExpectTableColumnsToMatchSet(
        column_set=sorted(set(spec.columns) | set(prepared.derived)), exact_match=spec.exact,
        meta={"doc": "the contract's column set" + ("" if spec.exact else " (at least)")})]
    if spec.min_rows:
        exps.append(E.ExpectTableRowCountToBeBetween(min_value=spec.min_rows, meta={"doc": f">= {spec.min_rows} rows"}))
    for col, typ in spec.columns.items():
        if col not in present:
            continue  # reported once by the column-set expectation
        if typ in ("int", "float"):
            types = ANY_INT if typ == "int" else ANY_FLOAT
            exps.append(E.ExpectColumnValuesToBeInTypeList(column=col, type_list=types))
        elif isinstance(typ, str):
            exps.append(E.ExpectColumnValuesToBeOfType(column=col, type_=typ))
        if col not in spec.nullable:
            exps.append(E.ExpectColumnValuesToNotBeNull(column=col))
    for check in spec.checks:
        if check.column is None or check.column in present:
            kwargs = {"column": check.column, **check.kwargs} if check.column else dict(check.kwargs)
            exps.append(getattr(E, check.expectation)(**kwargs, meta={"doc": check.doc}))
    docs = {d.name: d for d in all_derived(spec)}
    for name in prepared.derived:
        d = docs[name]
        if d.expect is not None:
            exps.append(E.ExpectColumnValuesToBeInSet(
                column=name, value_set=list(d.expect), meta={"doc": d.doc, "derived": True}))
    return gx.ExpectationSuite(name=spec.name, expectations=exps)


def _dtype_of(col: str) -> Compute:
    def compute(df: pl.DataFrame, env: Env) -> pl.Expr:
        if col not in df.columns:
            raise Skip(f"{col} missing")  # reported by the column-set expectation
        return pl.lit(dtype_repr(df.schema[col]))
    return compute


def all_derived(spec: Spec) -> list[Derived]:
    """``<col>:dtype`` for each nested column, then the spec's own derived columns."""
    nested = [Derived(f"{c}:dtype", _dtype_of(c), (dtype_repr(t),), f"{c} has dtype {dtype_repr(t)}")
              for c, t in spec.columns.items() if isinstance(t, pl.DataType)]
    return nested + list(spec.derived)


def show_exprs(spec: Spec, column: str | None) -> dict[str, pl.Expr]:
    """Extra columns the report shows for a failing row of ``column``."""
    for d in spec.derived:
        if d.name == column:
            return dict(d.show)
    return {}

"""
The split_join curriculum, grammar and decisions in one place: a training split joins the mix at a fixed
iteration or when a rule on a validation metric first holds ('acc/val_id>=0.9'). The decisions are read
from the metrics rows alone, so a resumed run joins exactly where the uninterrupted one did, and a resume
may change a join only where it has not acted yet. (qa_data.QAData applies a join to its rows; train.py asks
here when.) The other key that names a metric to steer by, stop_metric, is checked here too (STOP_METRIC_CHECK:
a validation split only); the stop itself is read from the rows by runlog.early_stop_row.
"""
import math
import re

from discoloop.common import ConfigError

JOIN_RULE = re.compile(r"^\s*([\w/]+)\s*(>=|<=)\s*([-+.\w]+)\s*$")


def parse_join_rule(rule):
    """'acc/val_id>=0.9' -> ('acc/val_id', '>=', 0.9). A one-line ConfigError for anything else."""
    m = JOIN_RULE.match(rule)
    try:
        value = float(m.group(3)) if m else math.nan
    except ValueError:
        value = math.nan
    if not m or not math.isfinite(value):
        raise ConfigError(f"split_join rule {rule!r} is invalid: allowed 'metric>=number' or 'metric<=number', "
                          "e.g. 'acc/val_id>=0.9'")
    metric, op = m.group(1), m.group(2)
    never = (metric.startswith("acc") and (value > 1 if op == ">=" else value < 0)) or \
        (metric.startswith("loss") and op == "<=" and value < 0)
    if never:  # accuracies lie in [0, 1], losses are >= 0: the split would silently never join
        raise ConfigError(f"split_join rule {rule!r} can never hold ({metric} lies in "
                          f"{'[0, 1]' if metric.startswith('acc') else '[0, inf)'})")
    if "test" in metric:
        raise ConfigError(f"split_join rule {rule!r}: a test split must not steer training; use a validation "
                          "or training metric")
    return metric, op, value


def valid_split_join(v):
    """{training split: iteration >= 0 or a rule}; a bad rule raises its own one-line ConfigError."""
    if not isinstance(v, dict):
        return False
    for when in v.values():
        if isinstance(when, str):
            parse_join_rule(when)
        elif not isinstance(when, int) or isinstance(when, bool) or when < 0:
            return False
    return True


CHECK = (valid_split_join, "a dict {training split: iteration (an integer >= 0) or a rule such as 'acc/val_id>=0.9'}")


def valid_stop_metric(v):  # the end point may be chosen by a validation split only (never train, never test)
    return v == "" or v == "val_loss" or (v.count("/") == 1 and v.split("/")[0] in ("acc", "acc1", "loss")
                                          and v.split("/")[1].startswith("val"))


STOP_METRIC_CHECK = (valid_stop_metric, "'' or a validation metric such as 'acc/val_id', 'loss/val_id' or 'val_loss' "
                                        "(a training or test split must not choose the end point)")


def rule_metrics(split_join):
    """The metrics the join rules read (their acc1/ columns must be evaluated)."""
    return [parse_join_rule(j)[0] for j in split_join.values() if isinstance(j, str)]


def check_against(split_join, metric_names):
    """Each rule names a metric this dataset reports."""
    for split, rule in split_join.items():
        if isinstance(rule, str) and parse_join_rule(rule)[0] not in metric_names:
            raise ConfigError(f"split_join[{split!r}]={rule!r}: {parse_join_rule(rule)[0]!r} is not a metric of this "
                              f"dataset (e.g. {[m for m in metric_names if 'val' in m]})")


def join_iteration(rows, rule):
    """Iteration of the first evaluation row at which `rule` ('acc/val_id>=0.9') held, or None: a split
    joined by a rule enters the mix at that iteration."""
    metric, op, value = parse_join_rule(rule)
    for r in rows:
        if metric in r and not r.get("eval_only") and (r[metric] >= value if op == ">=" else r[metric] <= value):
            return r["iter"]
    return None


def fired_joins(rows, rules):
    """{split: iteration} for the join rules ({split: 'metric>=x'}) that have held so far."""
    return {name: j for name, rule in rules.items() if (j := join_iteration(rows, rule)) is not None}


def joins_acted(split_join, rows, it):
    """{split: iteration it joined} for the joins that acted before iteration `it` (a split not listed is
    in the mix from 0), else None: what a checkpoint at `it` was trained with, and what a resume may
    not change. A join at `it` itself has not acted: the batch of iteration `it` is drawn after it."""
    out = {}
    for name, when in split_join.items():
        j = join_iteration(rows, when) if isinstance(when, str) else when
        out[name] = j if j is not None and j < it else None
    return out


def joins_changed(saved, wanted, rows, it):
    """None if a resume at iteration `it` may use split_join `wanted` where the checkpoint used `saved`: a
    curriculum may change only where it has not acted yet (a split not listed is in the mix from 0)."""
    was, now = joins_acted(saved, rows, it), joins_acted(wanted, rows, it)
    if any(was.get(s, 0) != now.get(s, 0) for s in set(was) | set(now)):
        return (f"split_join: the checkpoint (iteration {it}) was trained with {saved!r}, now {wanted!r}; "
                f"only joins at or after iteration {it} may change")
    return None

"""``rayft`` commands that talk to (or are) the rayft service.

    rayft serve [--host H] [--port P] [--ray-address URL] [--policy FILE] [--no-auth]   # RAYFT_* env vars too
    rayft token create --team NAME [--expires-in 90d|12h|never]          # prints a new API token once
    rayft token create --operator [--expires-in 1d|12h|...]               # every team's jobs: read, watch, cancel
    rayft token list [--team NAME] | rayft token revoke ID
    rayft backup DEST.db [--data-dir DIR]                                # the job store, while the service runs
    rayft submit SPEC.yaml [--watch] [--idempotency-key K] [--dry-run]
    rayft watch JOB [--after-seq N] | rayft get JOB | rayft list [--state RUNNING] [--team T] [--limit N] | rayft cancel JOB
    rayft logs JOB [--tail N] [--follow]                                 # the last lines of the job's log

Clients read ``RAYFT_ADDRESS`` (default 127.0.0.1:50051) and ``RAYFT_TOKEN``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import re
import sys
import time
from pathlib import Path
from typing import Any

from rayft_contract.records import JobSummary, StateChange
from rayft_contract.spec import SpecError

TEAM_TOKEN_DAYS = 90
OPERATOR_TOKEN_DAYS = 1
"""An operator's token opens every team's jobs: it lasts a day unless ``--expires-in`` says otherwise, made when needed."""


def add_commands(sub: Any, add_overrides: Any) -> None:
    p = sub.add_parser("serve", help="run the rayft gRPC service (embedded local Ray unless --ray-address)")
    p.add_argument("--host")
    p.add_argument("--port", type=int)
    p.add_argument("--data-dir", help="where jobs.db lives (default .rayft/service)")
    p.add_argument("--ray-address", help="Ray Jobs API, e.g. http://head:8265 (default: start a local cluster)")
    p.add_argument("--no-auth", action="store_true", help="no API tokens (loopback only)")
    p.add_argument("--policy", help="path policy YAML: each team's output root and allowed data/model locations (RAYFT_POLICY)")
    p.add_argument("--tls-cert", help="PEM certificate chain the service presents (RAYFT_TLS_CERT); TLS on every port")
    p.add_argument("--tls-key", help="its PEM private key (RAYFT_TLS_KEY)")
    p.add_argument("--tls-client-ca", help="PEM CA of team client certificates: mutual TLS (RAYFT_TLS_CLIENT_CA)")
    p.add_argument("--metrics-port", type=int, help="serve Prometheus metrics on this port, plaintext (RAYFT_METRICS_PORT)")
    p.set_defaults(command=cmd_serve)

    p = sub.add_parser("token", help="team API tokens: create, list, revoke (run where the service's data dir is)")
    p.add_argument("action", choices=["create", "list", "revoke"])
    p.add_argument("id", nargs="?", help="revoke: the token's id, from `rayft token list`")
    who = p.add_mutually_exclusive_group()
    who.add_argument("--team", help="create: the team the token acts for; list: only this team's (--operator: the operator's)")
    who.add_argument(
        "--operator", action="store_true", help="create: an operator's token, which reads, watches and cancels every team's jobs"
    )
    p.add_argument(
        "--expires-in", help=f"create: 12h, 30d, ... or never (default {TEAM_TOKEN_DAYS}d; an operator's {OPERATOR_TOKEN_DAYS}d)"
    )
    p.add_argument("--data-dir")
    p.set_defaults(command=cmd_token)

    p = sub.add_parser("backup", help="copy the job store to a new file, also while the service runs (where its data dir is)")
    p.add_argument("dest", help="the backup's file: a new one (service/backup.py says how to restore)")
    p.add_argument("--data-dir")
    p.set_defaults(command=cmd_backup)

    p = sub.add_parser("submit", help="submit a job to the service")
    p.add_argument("spec")
    add_overrides(p)
    p.add_argument("--idempotency-key", default="", help="retries with the same key return the same job")
    p.add_argument("--watch", action="store_true", help="follow the job to its end")
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="have the service check it (fields, your team's policy, the cluster's capacity) and say where it would write; create nothing",
    )
    p.set_defaults(command=cmd_submit)

    p = sub.add_parser("watch", help="follow a job's events until it ends")
    p.add_argument("job_id")
    p.add_argument("--after-seq", type=int, default=0)
    p.set_defaults(command=cmd_watch)

    for name, fn, text in (("get", cmd_get, "show one job"), ("cancel", cmd_cancel, "cancel a job")):
        p = sub.add_parser(name, help=text)
        p.add_argument("job_id")
        p.set_defaults(command=fn)

    p = sub.add_parser("logs", help="the last lines of a job's log (a failure's traceback)")
    p.add_argument("job_id")
    p.add_argument("-n", "--tail", type=int, default=0, help="this many lines (default 200, at most 10000)")
    p.add_argument("-f", "--follow", action="store_true", help="then every new line as the job writes it, until it ends")
    p.set_defaults(command=cmd_logs)

    p = sub.add_parser("list", help="list the team's jobs (an operator's token: every team's)")
    p.add_argument(
        "--state", action="append", default=[], choices=["QUEUED", "STARTING", "RUNNING", "SUCCEEDED", "FAILED", "CANCELLED"]
    )
    p.add_argument("--team", default="", help="an operator's token: only this team's jobs")
    p.add_argument("--limit", type=int, default=50, help="the newest this many jobs (default 50; 0: every one)")
    p.set_defaults(command=cmd_list)


def cmd_serve(args: argparse.Namespace) -> int:
    import asyncio

    from service.app import serve
    from service.policy import load_for
    from service.settings import ServiceSettings
    from service.store_sqlite import SqliteJobStore

    logging.getLogger().setLevel(logging.INFO)
    try:
        settings = ServiceSettings.from_env(
            host=args.host,
            port=args.port,
            data_dir=args.data_dir,
            ray_address=args.ray_address,
            auth=False if args.no_auth else None,
            policy_file=args.policy,
            tls_cert=args.tls_cert,
            tls_key=args.tls_key,
            tls_client_ca=args.tls_client_ca,
            metrics_port=args.metrics_port,
        )
    except ValueError as exc:
        raise SpecError("serve", str(exc)) from None
    policy = load_for(settings)  # before Ray starts: a bad policy is a one-line error, exit 2
    settings.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    settings.data_dir.chmod(0o700)  # tokens' hashes, every team's specs, the launch key, Ray's token
    store = SqliteJobStore(settings.data_dir / "jobs.db")  # and a damaged or read-only store: one line, exit 1
    embedded = settings.ray_address is None
    if not embedded:
        asyncio.run(serve(settings, store, policy))
        return 0
    # The service itself never imports Ray's runtime: the embedded cluster is started here, and stopped with
    # its temp dir when the service stops; when the service fails, Ray's logs stay there, and the log says where.
    from ray_jobs.local_ray import stop_local_cluster

    jobs_api, temp_dir = start_embedded_ray(settings.data_dir / "ray_auth_token")
    failed = True
    try:
        asyncio.run(serve(dataclasses.replace(settings, ray_address=jobs_api), store, policy))
        failed = False
    finally:
        stop_local_cluster(temp_dir, keep_logs=failed)
    return 0


def start_embedded_ray(auth_token_file: Path) -> tuple[str, str]:
    """A local Ray cluster owned by this process, for the embedded default, with Ray's token auth on (the
    token in ``auth_token_file``, beside jobs.db); returns its Jobs API address and its temp dir."""
    import os

    from ray_jobs.local_ray import start_local_cluster

    info = start_local_cluster(num_cpus=(os.cpu_count() or 2) + 2, dashboard=True, auth_token_file=auth_token_file)
    log = logging.getLogger("rayft.serve")
    log.info(
        "embedded Ray cluster at http://%s (token auth on; token in %s; its files in %s)",
        info["dashboard_url"],
        auth_token_file,
        info["temp_dir"],
    )
    return f"http://{info['dashboard_url']}", info["temp_dir"]


def cmd_token(args: argparse.Namespace) -> int:
    from service import auth
    from service.settings import ServiceSettings
    from service.store_sqlite import SqliteJobStore

    settings = ServiceSettings.from_env(data_dir=args.data_dir)
    if args.action == "create":
        team = auth.OPERATOR if args.operator else _token_team(args.team)
        days = OPERATOR_TOKEN_DAYS if args.operator else TEAM_TOKEN_DAYS
        expires_at = _expiry(args.expires_in or f"{days}d")
    store = SqliteJobStore(settings.data_dir / "jobs.db")
    try:
        if args.action == "create":
            token = auth.new_token()
            record = store.add_token(team, auth.hash_token(token), expires_at)
            print(token)
            until = time.strftime("%Y-%m-%d", time.gmtime(expires_at)) if expires_at else "never"
            print(
                f"(token {record.id}, {_holder(team)}, expires {until}; shown once, stored hashed; send it as RAYFT_TOKEN)",
                file=sys.stderr,
            )
        elif args.action == "list":
            for t in store.tokens(auth.OPERATOR if args.operator else args.team):
                expires = time.strftime("%Y-%m-%d", time.gmtime(t.expires_at)) if t.expires_at else "never"
                state = "revoked" if t.revoked_at else "expired" if t.expires_at and t.expires_at < time.time() else "live"
                print(
                    f"{t.id}  {_holder(t.team):<25} {time.strftime('%Y-%m-%d', time.gmtime(t.created_at))}  expires {expires:<10}  {state}"
                )
        else:
            if not args.id:
                raise SpecError("token revoke", "name the token: rayft token revoke ID (ids: rayft token list)")
            revoked = store.revoke_token(args.id)
            if revoked is None:
                raise SpecError("id", f"no token {args.id!r}: give the 12-character id `rayft token list` shows")
            print(f"revoked {revoked.id} ({_holder(revoked.team)})")
    finally:
        store.close()
    return 0


def _token_team(team: str | None) -> str:
    """Team names go into paths (a policy's ``{team}``): one safe path component, like job names."""
    if team is None:
        raise SpecError("--team", "name the team the token acts for (or --operator: a token for every team's jobs)")
    if re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}", team) is None:
        raise SpecError(
            "--team", f"must be 1-64 ASCII letters, digits, '-', '_' or '.', starting with a letter or digit, got {team!r}"
        )
    return team


def _holder(team: str) -> str:
    from service import auth

    return "operator: every team" if team == auth.OPERATOR else f"team {team}"


def _expiry(text: str) -> float | None:
    """``90d``, ``12h``, ``never``: when the token stops working, in Unix seconds."""
    if text == "never":
        return None
    match = re.fullmatch(r"(\d+)([dh])", text)
    if match is None or int(match.group(1)) == 0:
        raise SpecError("--expires-in", f"must be like 90d, 12h or never, got {text!r}")
    return time.time() + int(match.group(1)) * (86400 if match.group(2) == "d" else 3600)


def _client():  # noqa: ANN202
    from rayft.client import Client

    return Client()


def cmd_backup(args: argparse.Namespace) -> int:
    from service.backup import backup
    from service.settings import ServiceSettings

    done = backup(ServiceSettings.from_env(data_dir=args.data_dir).data_dir / "jobs.db", Path(args.dest))
    print(f"{done.jobs} jobs, {done.events} events and {done.tokens} tokens in {done.path} ({done.bytes / 2**20:.1f} MiB)")
    return 0


def cmd_submit(args: argparse.Namespace) -> int:
    from rayft_contract.spec import FineTuneSpec

    # Local inputs made absolute (they work where the cluster shares this disk); the output location is the
    # service's to place unless the spec names one (a relative output.dir means "wherever the service puts it").
    spec = FineTuneSpec.load(args.spec, args.set).with_absolute_paths(output=False)
    if args.dry_run:
        checked = _rpc(lambda: _client().validate(spec))
        print(f"the service would take it: team {checked.team}, output {checked.spec.output.dir} (nothing was created)")
        return 0
    job = _rpc(lambda: _client().submit(spec, args.idempotency_key))
    print(f"{job.id} {_state(job)}")
    return watch(job.id, 0) if args.watch else 0


def cmd_watch(args: argparse.Namespace) -> int:
    return watch(args.job_id, args.after_seq)


def cmd_get(args: argparse.Namespace) -> int:
    from google.protobuf.json_format import MessageToDict

    print(json.dumps(MessageToDict(_rpc(lambda: _client().get(args.job_id)), preserving_proto_field_name=True), indent=2))
    return 0


def cmd_cancel(args: argparse.Namespace) -> int:
    job = _rpc(lambda: _client().cancel(args.job_id))
    print(f"{job.id} {_state(job)}")
    return 0


def cmd_logs(args: argparse.Namespace) -> int:
    if args.follow:
        told: set[str] = set()

        def waiting(why: str) -> None:  # once per reason: the follower asks again every 2 s
            if why not in told:
                told.add(why)
                print(f"(waiting: {why})", file=sys.stderr, flush=True)

        lines = _client().follow_logs(args.job_id, args.tail, on_wait=waiting)
        while (line := _rpc(lambda: next(lines, None))) is not None:
            print(line, flush=True)
        return 0
    logs = _rpc(lambda: _client().logs(args.job_id, args.tail))
    if logs.lines_before:
        print(f"({logs.lines_before:,} earlier lines not shown; --tail N shows more)", file=sys.stderr)
    for line in logs.lines:
        print(line)
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    import datetime
    import itertools

    from rich.console import Console
    from rich.table import Table

    if args.limit < 0:
        raise SpecError("--limit", f"a number of jobs, 0 or more (0: every one), got {args.limit}")
    table = Table("job", "team", "name", "state", "updated", "message")
    wanted = args.limit + 1 if args.limit else None  # one more than shown: whether there are more to say so
    page_size = min(wanted or 500, 500)
    jobs = _rpc(lambda: list(itertools.islice(_client().list(args.state, page_size, team=args.team), wanted)))
    for job in jobs[: args.limit or None]:
        updated = datetime.datetime.fromtimestamp(job.updated_at).strftime("%Y-%m-%d %H:%M:%S")
        table.add_row(job.id, job.team, job.spec.name, _state(job), updated, job.message)
    Console().print(table)
    if args.limit and len(jobs) > args.limit:
        print(f"(the newest {args.limit} shown; more with --limit N, or --limit 0 for every one)", file=sys.stderr)
    return 0


def watch(job_id: str, after_seq: int) -> int:
    """Follow a job with the progress bar; print its summary; exit 0 only if it succeeded."""
    import grpc

    from rayft.progress import ProgressView
    from rayft_contract.convert import event_from_proto

    client = _client()
    job = _rpc(lambda: client.get(job_id))
    summary, state = None, _state(job)
    with ProgressView(job.spec.name, job.spec.train.max_steps or None) as view:
        try:
            for message in client.watch(job_id, after_seq):
                if not message.WhichOneof("payload"):
                    continue  # a kind newer than this client: nothing to draw
                event = event_from_proto(message)
                if event.kind == "state":
                    state = StateChange.from_dict(event.data).state
                if event.kind == "summary":
                    summary = JobSummary.from_dict(event.data)
                else:
                    view(event)
        except grpc.RpcError as exc:
            from rayft.exits import from_rpc_error

            raise from_rpc_error(exc) from None
    if summary:
        view.print_summary(summary)
    print(f"{job_id} {state}" + (f": {client.get(job_id).message}" if state != "SUCCEEDED" else ""))
    if state == "FAILED":
        print(f"its log: rayft logs {job_id}", file=sys.stderr)
    return 0 if state == "SUCCEEDED" else 1


def _state(job: Any) -> str:
    from rayft_contract.convert import state_from_proto

    return state_from_proto(job.state).value


def _rpc(call: Any) -> Any:
    """Run a client call; turn a gRPC error into the CLI's one-line error."""
    import grpc

    from rayft.exits import from_rpc_error

    try:
        return call()
    except grpc.RpcError as exc:
        raise from_rpc_error(exc) from None

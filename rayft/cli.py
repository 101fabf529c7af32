"""The ``rayft`` command line.

    rayft demo [--direct]               # tiny model + data under .rayft/tiny, trained through the embedded service
    rayft train SPEC.yaml [--address ray://...|auto] [--set train.max_steps=10] [--overwrite]
    rayft check SPEC.yaml               # validate the spec and what it points at; start nothing
    rayft merge RUN/adapter --out DIR   # fold an adapter into its base model
    rayft generate RUN --prompt TEXT    # answer with the base model and the trained adapter
    rayft cache list|prune              # the dataset and model caches (see rayft/cli_cache.py)
    rayft warm start|status|stop        # the operator's warm pool on a running cluster (see rayft/cli_warm.py)
    rayft --version

Exit codes (``rayft.exits``): 0 success; 1 the job failed or was cancelled; 2 usage or spec error;
3 the service or the cluster is unreachable.

Heavy imports (Ray, torch, transformers) happen inside the commands that need them.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path

from rayft import exits
from rayft_contract.spec import FineTuneSpec, SpecError

DEMO_PRESET = "tiny_cpu.yaml"


def main(argv: list[str] | None = None) -> int:
    """Run one command; the exit codes are in ``rayft.exits`` (argparse's usage errors exit 2 too)."""
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        return args.command(args)
    except SpecError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exits.USAGE
    except (exits.Unreachable, ConnectionError) as exc:  # ray.init raises ConnectionError for a cluster it cannot reach
        _one_line(f"unreachable: {exc}", args.verbose)
        return exits.UNREACHABLE
    except KeyboardInterrupt:
        print("interrupted: an unfinished run resumes from its last checkpoint when started again", file=sys.stderr)
        return exits.INTERRUPTED
    except Exception as exc:  # noqa: BLE001 - the job or the command failed: one line, not a traceback
        from rayft_contract.records import Failure

        _one_line(f"failed: {Failure.reason_of(exc)}", args.verbose)
        return exits.JOB_FAILED


def _one_line(message: str, verbose: bool) -> None:
    if verbose:
        import traceback

        traceback.print_exc()
    print(f"error: {message}" + ("" if verbose else " (--verbose for the traceback)"), file=sys.stderr)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rayft", description="LoRA/QLoRA fine-tuning on Ray.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level; tracebacks on errors")
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(required=True, metavar="COMMAND")

    p = sub.add_parser("train", help="run a fine-tuning job and show its progress")
    p.add_argument("spec", help="job spec, YAML or JSON (see ray_jobs/presets/)")
    _add_run_flags(p)
    p.set_defaults(command=cmd_train)

    p = sub.add_parser("demo", help="tiny model + data, trained on CPU through the embedded service (gRPC, local Ray)")
    p.add_argument("--dir", default=".rayft/tiny", help="where the tiny assets live (default: .rayft/tiny)")
    p.add_argument("--direct", action="store_true", help="skip the service: train in this process, like `rayft train`")
    _add_run_flags(p)
    p.set_defaults(command=cmd_demo, overwrite=True)

    p = sub.add_parser("check", help="validate a spec and the model and data it names; start nothing")
    p.add_argument("spec")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a field")
    p.set_defaults(command=cmd_check)

    from rayft.cli_service import add_commands

    add_commands(sub, _add_overrides)

    from rayft import cli_cache, cli_warm

    cli_cache.add_commands(sub)
    cli_warm.add_commands(sub, _add_overrides)

    p = sub.add_parser("merge", help="fold a LoRA adapter into its base model and save the result")
    p.add_argument("adapter", help="adapter directory: RUN or RUN/adapter")
    p.add_argument("--out", required=True, help="directory for the merged model")
    p.add_argument("--base", help="base model (default: the one recorded in adapter_config.json)")
    p.set_defaults(command=cmd_merge)

    p = sub.add_parser("generate", help="answer a prompt with a base model and a trained adapter (greedy)")
    p.add_argument("adapter", help="run directory (RUN) or adapter directory (RUN/adapter)")
    p.add_argument("--prompt", required=True, help="the user's message")
    p.add_argument("--system", help="a system message before it")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--base", help="base model (default: the one recorded in adapter_config.json)")
    p.set_defaults(command=cmd_generate)
    return parser


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("rayft")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown (not installed)"


def _add_overrides(p: argparse.ArgumentParser) -> None:
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a field, e.g. train.max_steps=10")


def _add_run_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--address", help="Ray cluster address (default: start a local cluster)")
    _add_overrides(p)
    p.add_argument("--overwrite", action="store_true", help="replace a finished run of the same name")
    p.add_argument("--inject-failure-at", type=int, metavar="STEP", help="chaos test: fail one worker once at STEP")
    p.add_argument(
        "--cap-gpu-memory", type=float, metavar="GB", help="test: each worker uses at most GB of its GPU, as a smaller GPU would"
    )


def load_spec(path: str, overrides: list[str]) -> FineTuneSpec:
    """Load a spec file with ``section.key=value`` overrides (merged before validation)."""
    return FineTuneSpec.load(path, overrides)


def cmd_train(args: argparse.Namespace) -> int:
    return _train(load_spec(args.spec, args.set), args)


def cmd_demo(args: argparse.Namespace) -> int:
    from importlib.resources import files

    from ray_jobs.tiny import ensure_tiny_assets

    print(f"preparing the tiny model, tokenizer and data in {args.dir} ...")
    root = ensure_tiny_assets(args.dir)
    spec = load_spec(
        str(files("ray_jobs") / "presets" / DEMO_PRESET), [f"model.path={root}/model", f"data.path={root}/train.jsonl", *args.set]
    )
    if args.direct:
        return _train(spec, args)
    return _demo_via_service(spec, Path(args.dir).parent / "service")


def _demo_via_service(spec: FineTuneSpec, data_dir: Path) -> int:
    """Start the embedded service (local Ray, SQLite), submit over gRPC, watch to the end."""
    from ray_jobs.data.preflight import check
    from rayft.cli_service import watch
    from rayft.client import Client
    from rayft.local_service import local_service

    check(spec)
    spec = spec.with_absolute_paths().replace(name=f"{spec.name}-{time.strftime('%Y%m%d-%H%M%S')}")
    print(f"starting the rayft service (embedded Ray, SQLite in {data_dir}) ...")
    with local_service(data_dir) as address:
        os.environ["RAYFT_ADDRESS"] = address
        job = Client(address).submit(spec)
        print(f"submitted {job.id} over gRPC to {address}; watching")
        return watch(job.id, 0)


def cmd_check(args: argparse.Namespace) -> int:
    from ray_jobs.data import preflight

    spec = load_spec(args.spec, args.set)
    inputs = preflight.check(spec)
    print(
        f"ok: {spec.name}: model {spec.model.path}, data {spec.data.path} ({inputs.format}, {len(inputs.files.paths)} "
        f"file(s)), {spec.scaling.num_workers} worker(s)"
    )
    return 0


def _train(spec: FineTuneSpec, args: argparse.Namespace) -> int:
    from ray_jobs.chaos import Chaos
    from ray_jobs.data import preflight
    from ray_jobs.run import run
    from rayft.progress import ProgressView

    inputs = preflight.check(spec)  # fail fast, before the progress view and the cluster start
    with ProgressView(spec.name, spec.train.max_steps) as view:
        chaos = Chaos(fail_at_step=args.inject_failure_at, gpu_memory_gb=args.cap_gpu_memory)
        result = run(spec, address=args.address, on_event=view, chaos=chaos, overwrite=args.overwrite, inputs=inputs)
    view.print_summary(result.summary)
    return 0


def cmd_merge(args: argparse.Namespace) -> int:
    from ray_jobs import generate

    adapter = generate.adapter_dir(args.adapter)  # RUN or RUN/adapter, as `rayft generate` takes it
    base, local = generate.base_of(adapter, args.base)  # a base that is not there is said before the imports' seconds

    from peft import PeftModel
    from transformers import AutoTokenizer

    from ray_jobs.cache.model_files import load_pretrained

    model = PeftModel.from_pretrained(load_pretrained(local, base), adapter)
    model.merge_and_unload().save_pretrained(args.out)
    AutoTokenizer.from_pretrained(adapter).save_pretrained(args.out)
    print(f"merged {adapter} into {base}: {args.out}")
    return 0


def cmd_generate(args: argparse.Namespace) -> int:
    from ray_jobs import generate

    model, tokenizer = generate.load(generate.adapter_dir(args.adapter), args.base)
    ids = generate.prompt_ids(tokenizer, args.prompt, args.system)
    print(generate.answer(model, tokenizer, ids, args.max_new_tokens))
    return 0


if __name__ == "__main__":
    sys.exit(main())

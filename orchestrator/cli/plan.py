"""``orchestrator plan [hydra overrides] [--json]``: memory per GPU and cost of a job before it runs (``orchestrator.planning.plan``)."""

from __future__ import annotations

import sys
from typing import Optional

from orchestrator.core.console import Parser, fail
from orchestrator.core.errors import UserError
from orchestrator.planning.plan import plan_text


def main(argv: Optional[list[str]] = None) -> int:
    """``orchestrator plan [hydra overrides]``: print the plan. Exit 0, or the error's code (4: bad config)."""
    from orchestrator.app.compose import compose_config

    parser = Parser(
        prog="orchestrator plan",
        description="Estimate memory per GPU and cost for a job before "
        "running it, from the same Hydra overrides as the launch.",
    )
    parser.add_argument(
        "overrides",
        nargs="*",
        metavar="OVERRIDE",
        help="Hydra overrides, as for the launch: e.g. model=llama-3.1-8b recipe=qlora compute=l40s-spot",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help="print spot against on-demand per GPU type that fits, and the recommendation, as JSON",
    )
    args = parser.parse_intermixed_args(list(sys.argv[1:] if argv is None else argv))
    try:
        print(plan_text(compose_config(args.overrides), as_json=args.json))
    except UserError as err:  # a bad config: the launch's exit code (4)
        return fail(err, err.exit_code)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Pod failures as the operator names them, and the model server's side of ModelLoadFailed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from click.testing import CliRunner

from carpool.contract.pod import LOAD_FAILED
from carpool_model_server import main as model_server
from carpool_operator.pods import pod_problem


def test_a_failed_load_leaves_a_termination_message(tmp_path: Path) -> None:
    log = tmp_path / "termination-log"
    log.write_text("")  # the kubelet mounts the file; the server only writes into it
    # Written where --termination-log says (a pod's terminationMessagePath), by the one writer.
    args = ["--handler", "nosuch.module:Model", "--port", "0", "--device", "cpu"]
    args += ["--termination-log", str(log)]
    result = CliRunner().invoke(model_server.command, args)
    assert result.exit_code != 0
    assert log.read_text().startswith(LOAD_FAILED)
    assert "nosuch" in log.read_text()
    reported = pod_problem([pod(container(terminated={"exitCode": 1, "message": log.read_text()}))])
    assert reported is not None and reported[0] == "ModelLoadFailed"


def container(**state: Any) -> dict[str, Any]:
    return {"name": "model-server", "state": state}


def pod(*containers: dict[str, Any], **status: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "m-1"},
        "status": {"containerStatuses": list(containers), **status},
    }


def test_the_most_telling_problem_wins() -> None:
    pulling = pod(container(waiting={"reason": "ErrImagePull", "message": "not found"}))
    crashing = pod(container(waiting={"reason": "CrashLoopBackOff"}))
    assert pod_problem([crashing, pulling]) == (
        "ImagePullBackOff",
        "pod m-1, model-server: not found",
    )
    assert pod_problem([pod(container(running={}))]) is None
    # A crash of the sidecar's log tail is no model load failure.
    other = {"exitCode": 2, "message": "Traceback ..."}
    reason, _ = pod_problem(
        [
            pod(
                {
                    **container(waiting={"reason": "CrashLoopBackOff"}),
                    "lastState": {"terminated": other},
                }
            )
        ]
    ) or ("", "")
    assert reason == "CrashLoopBackOff"


def test_a_missing_secret_is_named_from_the_kubelets_report() -> None:
    missing = container(
        waiting={"reason": "CreateContainerConfigError", "message": 'secret "token" not found'}
    )
    assert pod_problem([pod(missing)]) == (
        "SecretNotFound",
        'pod m-1, model-server: secret "token" not found',
    )
    # A missing key of a Secret that exists is another configuration error.
    message = "couldn't find key token in Secret default/token"
    no_key = container(waiting={"reason": "CreateContainerConfigError", "message": message})
    assert pod_problem([pod(no_key)]) == (
        "CreateContainerConfigError",
        f"pod m-1, model-server: {message}",
    )

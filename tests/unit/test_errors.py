"""One error family: what a client sees of an exception, whatever wrapped it on the way."""

from __future__ import annotations

from serve_app.errors import ErrorCode, InternalError, InvalidArgument, as_serve_error, error_of


class RayTaskError(Exception):
    __module__ = "ray.exceptions"

    def __init__(self, text: str, cause: BaseException | None) -> None:
        super().__init__(text)
        self.cause = cause


def test_a_wrapped_server_error_comes_out_as_itself() -> None:
    inner = InvalidArgument("bad")
    assert as_serve_error(RayTaskError("ray::ServeReplica:app:x (pid=1) ...", inner)) is inner


def test_a_wrapped_plain_exception_is_named_by_the_innermost_cause_not_by_ray() -> None:
    err = as_serve_error(RayTaskError("ray::ServeReplica:app:model_manager (pid=42) Traceback ...", OSError("boom")))
    assert isinstance(err, InternalError)
    assert err.message == "OSError: boom"


def test_a_ray_error_without_a_cause_shows_none_of_its_text() -> None:
    err = as_serve_error(RayTaskError("ray::ServeReplica:app:x (pid=7) Traceback (most recent call last)", None))
    assert "pid" not in err.message and "Traceback" not in err.message and "ray::" not in err.message


def test_a_ray_error_without_a_cause_is_named_in_words_that_do_not_name_ray() -> None:
    said = {}
    for kind in ("RayActorError", "ActorDiedError", "GetTimeoutError", "TaskCancelledError", "ObjectLostError",
                 "RaySystemError"):  # fmt: skip
        error_type = type(kind, (RayTaskError,), {"__module__": "ray.exceptions"})
        said[kind] = as_serve_error(error_type("ray::x (pid=7)", None)).message
        assert "Ray" not in said[kind] and "ray" not in said[kind].lower().split(), said[kind]
    assert said["RayActorError"].endswith("a server process it needed stopped")
    assert said["GetTimeoutError"].endswith("it timed out")


def test_error_of_maps_each_code_to_its_class() -> None:
    for code in ErrorCode:
        assert error_of(code, "m").code is code

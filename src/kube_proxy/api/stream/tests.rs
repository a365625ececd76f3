use kube::core::Status;
use kube::runtime::watcher;

use super::refuses_streaming;

fn status(code: u16, reason: &str) -> Box<Status> {
    Status::failure(
        "sendInitialEvents is forbidden for watch unless the WatchList feature gate is enabled",
        reason,
    )
    .with_code(code)
    .boxed()
}

#[test]
fn only_a_refused_request_turns_to_paged_lists() {
    // An apiserver with WatchList off answers the watch's start, or its first event, so.
    assert!(refuses_streaming(&watcher::Error::WatchStartFailed(
        kube::Error::Api(status(422, "Invalid"))
    )));
    assert!(refuses_streaming(&watcher::Error::WatchError(status(
        400,
        "BadRequest"
    ))));
    // Away, overloaded, forbidden, expired: the watcher retries, still streaming.
    for (code, reason) in [
        (500, "InternalError"),
        (503, "ServiceUnavailable"),
        (403, "Forbidden"),
        (410, "Expired"),
        (429, "TooManyRequests"),
    ] {
        assert!(
            !refuses_streaming(&watcher::Error::WatchStartFailed(kube::Error::Api(status(
                code, reason
            )))),
            "{code}"
        );
        assert!(
            !refuses_streaming(&watcher::Error::WatchError(status(code, reason))),
            "{code}"
        );
    }
    assert!(!refuses_streaming(&watcher::Error::NoResourceVersion));
}

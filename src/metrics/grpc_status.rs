//! gRPC status codes as upstream's `code` label holds them.

/// A gRPC code as grpc-go's `codes.Code.String()` spells it (`Canceled`, `OK`), which is what
/// the `code` label holds upstream; tonic spells two of them differently.
pub fn go_code_name(code: tonic::Code) -> &'static str {
    use tonic::Code::*;
    match code {
        Ok => "OK",
        Cancelled => "Canceled",
        Unknown => "Unknown",
        InvalidArgument => "InvalidArgument",
        DeadlineExceeded => "DeadlineExceeded",
        NotFound => "NotFound",
        AlreadyExists => "AlreadyExists",
        PermissionDenied => "PermissionDenied",
        ResourceExhausted => "ResourceExhausted",
        FailedPrecondition => "FailedPrecondition",
        Aborted => "Aborted",
        OutOfRange => "OutOfRange",
        Unimplemented => "Unimplemented",
        Internal => "Internal",
        Unavailable => "Unavailable",
        DataLoss => "DataLoss",
        Unauthenticated => "Unauthenticated",
    }
}

/// The gRPC code upstream counts for a stream that failed with `status`. A peer that goes
/// away (it cancelled the stream, or its connection ended) is `Canceled` in grpc-go, whose
/// stream context is cancelled then; tonic reports those as transport errors (Unknown).
pub fn stream_error_code(status: &tonic::Status) -> tonic::Code {
    let code = status.code();
    if code == tonic::Code::Unknown && peer_went_away(status) {
        return tonic::Code::Cancelled;
    }
    code
}

fn peer_went_away(status: &tonic::Status) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(status);
    while let Some(error) = source {
        if let Some(h2) = error.downcast_ref::<h2::Error>() {
            // The connection broke or closed under the stream, or the peer reset it with CANCEL.
            return h2.is_io() || h2.is_go_away() || h2.reason() == Some(h2::Reason::CANCEL);
        }
        if error.is::<std::io::Error>() {
            return true;
        }
        source = error.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_that_cancels_is_canceled() {
        assert_eq!(
            stream_error_code(&tonic::Status::cancelled("x")),
            tonic::Code::Cancelled
        );
        assert_eq!(
            stream_error_code(&tonic::Status::internal("x")),
            tonic::Code::Internal
        );
        assert_eq!(go_code_name(tonic::Code::Cancelled), "Canceled");
        assert_eq!(go_code_name(tonic::Code::Ok), "OK");
    }
}

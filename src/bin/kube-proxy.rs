//! kube-proxy: the node's Service proxy (a drop-in for upstream's, in its nftables mode).

use std::process::ExitCode;

use kube_traffic::kube_proxy::trace_cli;

fn main() -> ExitCode {
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if args.get(1).is_some_and(|a| a == trace_cli::NAME) {
        return trace_cli::main(args);
    }
    eprintln!("Error: only `kube-proxy trace` is wired yet");
    ExitCode::from(1)
}

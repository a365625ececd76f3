//! What needs no apiserver.

use super::*;

/// Runs `bin args` in a namespace of its own (so that a binary that wrongly started would
/// program nothing of the machine's), stopped after 60 s; exit code, stdout and stderr.
pub(crate) fn run_alone(ns: &str, bin: &Path, args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new("ip")
        .args(["netns", "exec", ns, "timeout", "60"])
        .arg(bin)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run kube-proxy");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `--proxy-mode=userspace` (removed in 1.26) and `kernelspace` (Windows only): ours refuses
/// them with upstream's own validation message and exit code, upstream's binary run with the
/// same command line being the reference.
#[test]
pub(crate) fn userspace_and_kernelspace_get_upstreams_error() {
    if !netns::can_run("userspace_and_kernelspace_get_upstreams_error") || !kube_proxy::preflight()
    {
        return;
    }
    let ns = netns::Netns::new("kpmodes").expect("a namespace");
    let upstream = Impl::Upstream.binary(&upstream_dir());
    let ours = Impl::Ours.binary(Path::new(""));
    for mode in ["userspace", "kernelspace"] {
        let flag = format!("--proxy-mode={mode}");
        let args = [
            flag.as_str(),
            "--kubeconfig=/nonexistent/kubeconfig",
            "--hostname-override=node-a",
        ];
        let (up_code, _, up_err) = run_alone(ns.name(), &upstream, &args);
        let (our_code, _, our_err) = run_alone(ns.name(), &ours, &args);
        eprintln!("{mode}: upstream exit {up_code:?}: {up_err}ours exit {our_code:?}: {our_err}");
        let up_line = up_err
            .lines()
            .find(|l| l.contains("command failed"))
            .unwrap_or_else(|| panic!("upstream printed no failure for {mode}: {up_err}"));
        let message = klog_message(up_line);
        assert!(
            message.starts_with("failed validate: KubeProxyConfiguration.Mode.ProxyMode"),
            "{message}"
        );
        assert!(
            our_err.contains(&message),
            "{mode}: ours does not print upstream's message {message:?}:\n{our_err}"
        );
        assert_eq!(our_code, up_code, "{mode}: the exit codes differ");
    }
    let tables = ns.nft(&["list", "tables"]).expect("nft list tables");
    assert!(
        tables.trim().is_empty(),
        "a refused mode programmed: {tables}"
    );
}

/// An ipvs scheduler nothing here can serve is refused at start, naming the flag, before
/// anything is programmed.
#[test]
pub(crate) fn an_unservable_ipvs_scheduler_is_refused_at_start() {
    if !netns::can_run("an_unservable_ipvs_scheduler_is_refused_at_start") {
        return;
    }
    let ns = netns::Netns::new("kpsched").expect("a namespace");
    let ours = Impl::Ours.binary(Path::new(""));
    let (code, _, err) = run_alone(
        ns.name(),
        &ours,
        &[
            "--proxy-mode=ipvs",
            "--ipvs-scheduler=lc",
            "--kubeconfig=/nonexistent/kubeconfig",
            "--hostname-override=node-a",
            "--conntrack-max-per-core=0",
        ],
    );
    eprintln!("exit {code:?}: {err}");
    assert!(
        code.is_some_and(|c| c != 0),
        "lc was not refused: exit {code:?}"
    );
    assert!(
        err.contains("--ipvs-scheduler") && err.contains("\"lc\""),
        "the refusal does not name the flag and the value: {err}"
    );
    let tables = ns.nft(&["list", "tables"]).expect("nft list tables");
    assert!(
        tables.trim().is_empty(),
        "a refused scheduler programmed: {tables}"
    );
}

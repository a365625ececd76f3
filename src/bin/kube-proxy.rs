//! kube-proxy: the node's Service proxy (a drop-in for upstream's, in its nftables mode).
//! Parses, loads and validates the configuration, then runs the proxy as a service
//! (`kube_proxy::service`); `--cleanup` and `--init-only` do their one step and exit.
//! `kube-proxy trace` runs `trace_cli` instead.

use std::process::ExitCode;

use kube_traffic::cli::{self, fail};
use kube_traffic::config::layers;
use kube_traffic::kube_proxy;
use kube_traffic::kube_proxy::config::load::{self, WriteFormat};
use kube_traffic::kube_proxy::config::print_flags;
use kube_traffic::kube_proxy::config::ProxyConfig;
use kube_traffic::kube_proxy::trace_cli;
use kube_traffic::lifecycle::startup_pages;

// jemalloc (see src/allocator.rs), installed by the binary as the other programs do.
#[cfg(feature = "jemalloc")]
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

// The proxy's allocator options, as the agent's (src/bin/konnectivity-agent.rs says why): one
// arena rather than four per CPU, and small thread caches. Its work is a few tasks that run
// now and then (the watches, one sync per family), not many threads allocating at once, so
// an arena per CPU only holds pages an idle proxy never uses again. And freed pages go back
// to the kernel at once (`dirty_decay_ms:0`) rather than after a second: a full sync's
// allocations come in one burst (the wanted table, then its transaction), and pages the
// burst outgrew (a vector's previous buffer, a map's before it grew) would otherwise be
// counted until the decay, on top of everything the sync still holds. At 10,000 Services x
// 10 endpoints the first sync's peak RSS is 73 MiB instead of 80.
//
// SAFETY (exporting a symbol): jemalloc declares `const char *malloc_conf` (prefixed `_rjem_`,
// as tikv-jemalloc-sys builds it) as a weak symbol for programs to define; this is the only
// definition, a pointer to a NUL-terminated constant that is never written.
#[cfg(feature = "jemalloc")]
#[allow(unsafe_code)]
#[export_name = "_rjem_malloc_conf"]
#[allow(non_upper_case_globals)]
pub static malloc_conf: &[u8; 54] = b"narenas:1,tcache_nslots_small_max:16,dirty_decay_ms:0\0";

/// Runtime workers: the proxy's tasks are few and mostly wait (watches, one sync per family,
/// the HTTP ports), so two are plenty however many CPUs the node has.
const WORKERS: usize = 2;

fn main() -> ExitCode {
    let _finish_logs = cli::FinishLogs;
    start()
}

fn start() -> ExitCode {
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if args.get(1).is_some_and(|a| a == trace_cli::NAME) {
        return trace_cli::main(args);
    }
    let cli = match load::parse_args(args) {
        Ok(cli) => cli,
        Err(code) => return code,
    };
    if let Some(text) = load::version_text(&cli.options.version) {
        println!("{text}");
        return ExitCode::SUCCESS;
    }
    let options = match load::load(&cli) {
        Ok(options) => options,
        Err(e) => return fail(format_args!("failed complete: {e}")),
    };
    cli::init_logging(
        "kube-proxy",
        &cli::LogFlags {
            v: options.v,
            vmodule: &options.vmodule_text(),
            log_format: options.log_format,
            logtostderr: options.logtostderr,
            alsologtostderr: options.alsologtostderr,
            log_file: &options.log_file,
            log_dir: &options.log_dir,
            log_file_max_size: options.log_file_max_size,
        },
    );
    for warning in &options.load_warnings {
        tracing::warn!("{warning}");
    }
    for line in print_flags::flag_lines(&options) {
        tracing::info!(v = 1, "FLAG: {line}");
    }
    let mut warnings = Vec::new();
    let validated = ProxyConfig::with_warnings(&options, &mut warnings);
    for warning in &warnings {
        tracing::warn!("{warning}");
    }
    let config = match validated {
        Ok(config) => config,
        Err(e) if options.check_config => {
            return cli::check_result(options.config.as_deref(), Err(e.to_string()))
        }
        Err(e) => return fail(e),
    };
    if !options.write_config_to.is_empty() {
        let path = &options.write_config_to;
        let text = match load::write_format(path) {
            WriteFormat::Toml => layers::to_toml(&options),
            WriteFormat::KubeProxyConfiguration => config.v1alpha1_yaml(),
        };
        if path == "-" {
            print!("{text}");
            return ExitCode::SUCCESS;
        }
        return match std::fs::write(path, text) {
            Ok(()) => {
                tracing::info!(file = %path, "Wrote configuration");
                ExitCode::SUCCESS
            }
            Err(e) => fail(format_args!("open {path}: {e}")),
        };
    }
    if options.check_config {
        return cli::check_result(options.config.as_deref(), Ok(()));
    }
    // Before the runtime's threads exist: see lifecycle::startup_pages.
    let startup = startup_pages::capture();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(WORKERS)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return fail(format_args!("cannot start the async runtime: {e}")),
    };
    let config_file = options.config.clone();
    let result = runtime.block_on(async move {
        if config.cleanup {
            return if kube_proxy::node_service::cleanup(&config).await {
                Ok(())
            } else {
                Err(kube_proxy::run::RunError::Fatal(
                    "encountered an error while tearing down rules".into(),
                ))
            };
        }
        kube_proxy::node_service::prepare(&config).await?;
        if config.init_only {
            tracing::info!("System initialized and --init-only specified");
            return Ok(());
        }
        kube_proxy::service::run_service(cli, config_file, config, startup).await
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(e),
    }
}

//! konnectivity-agent: parses, validates, binds, and runs the agent as a service.

use std::process::ExitCode;

use kube_traffic::agent::{self, AgentConfig, AgentListeners, AgentOptions, Snapshot};
use kube_traffic::cli::{self, fail};
use kube_traffic::config::layers;
use kube_traffic::lifecycle::{self, startup_pages};

// jemalloc (see src/allocator.rs): installed by the binary rather than the library, so test
// binaries can count allocations with an allocator of their own.
#[cfg(feature = "jemalloc")]
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

// The agent's allocator options, read by jemalloc before `main` and applied over the build's
// (`.cargo/config.toml`): one arena instead of four per CPU, and thread caches of at most 16
// blocks per small size class instead of 200. The agent runs two runtime workers, each
// allocating from its own thread cache and reaching the arena only to refill or flush it,
// while every arena keeps partly used pages of each size class and a background thread of its
// own: at idle one arena holds about 0.5 MB less and runs fewer threads. Start-up leaves the
// caches full of blocks an idle agent never asks for again (about 0.3 MB at the default
// size); a tunnel's packets allocate and free a few blocks at a time, which 16 slots hold
// (benches/RESULTS.md). The server, with more workers and thousands of tunnels, keeps the
// defaults.
//
// SAFETY (exporting a symbol): jemalloc declares `const char *malloc_conf` (prefixed
// `_rjem_`, as tikv-jemalloc-sys builds it) as a weak symbol for programs to define; this is
// the only definition, a pointer to a NUL-terminated constant that is never written.
#[cfg(feature = "jemalloc")]
#[allow(unsafe_code)]
#[export_name = "_rjem_malloc_conf"]
#[allow(non_upper_case_globals)]
pub static malloc_conf: &[u8; 37] = b"narenas:1,tcache_nslots_small_max:16\0";

const PROGRAM: &str = "konnectivity-agent";

fn main() -> ExitCode {
    let _finish_logs = cli::FinishLogs;
    start()
}

fn start() -> ExitCode {
    let cli = match cli::parse::<AgentOptions>() {
        Ok(cli) => cli,
        Err(code) => return code,
    };
    let mut options = match layers::load(&cli) {
        Ok(options) => options,
        Err(e) => return fail(e),
    };
    cli::init_logging(
        PROGRAM,
        &cli::LogFlags {
            v: options.v,
            vmodule: &options.vmodule,
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
    if let Some(path) = options.write_config_to.clone() {
        return cli::write_config(&options, &path);
    }
    if options.dev {
        if let Err(e) = agent::dev::apply(&mut options) {
            return fail(e);
        }
    }
    let config = match AgentConfig::from_options(&options) {
        Ok(config) => config,
        Err(e) => return fail(format_args!("failed to validate agent options with {e}")),
    };
    let snapshot = match Snapshot::build(config) {
        Ok(snapshot) => snapshot,
        Err(e) if options.check_config => {
            return cli::check_result(options.config.as_deref(), Err(e.to_string()))
        }
        Err(e) => return fail(format_args!("failed to run proxy connection with {e}")),
    };
    if options.check_config {
        // The token is read at every connection attempt: it must be readable now.
        let token = match snapshot.config.token_path() {
            Some(path) => std::fs::read(path)
                .map(|_| ())
                .map_err(|e| format!("cannot read the token file {}: {e}", path.display())),
            None => Ok(()),
        };
        return cli::check_result(options.config.as_deref(), token);
    }
    if snapshot.config.admin_addr.ip().is_unspecified() && snapshot.config.enable_profiling {
        tracing::warn!(admin = %snapshot.config.admin_addr, "profiling is exposed on every interface: --admin-bind-address is empty");
    }
    // Before the runtime's threads exist: see lifecycle::startup_pages.
    let startup = startup_pages::capture();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return fail(format_args!("cannot start the async runtime: {e}")),
    };
    lifecycle::raise_nofile_limit();
    let result = runtime.block_on(async move {
        let listeners = AgentListeners::bind(&snapshot.config).await?;
        agent::service::run_service(cli, snapshot, listeners, startup).await?;
        Ok::<(), anyhow::Error>(())
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(format_args!("{e:#}")),
    }
}

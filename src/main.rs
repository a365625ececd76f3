use std::process::ExitCode;

use kube_traffic::cli::{self, fail};
use kube_traffic::config::{layers, Config, Options};
use kube_traffic::{dev, lifecycle, tunnels_cli, Inherited, Listeners, Snapshot};

// jemalloc (see src/allocator.rs): installed by the binary rather than the library, so test
// binaries can count allocations with an allocator of their own.
#[cfg(feature = "jemalloc")]
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> ExitCode {
    let _finish_logs = cli::FinishLogs;
    start()
}

fn start() -> ExitCode {
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if args.get(1).is_some_and(|a| a == tunnels_cli::NAME) {
        return tunnels_cli::main(args);
    }
    let cli = match cli::parse::<Options>() {
        Ok(cli) => cli,
        Err(code) => return code,
    };
    let mut options = match layers::load(&cli) {
        Ok(options) => options,
        Err(e) => return fail(e),
    };
    cli::init_logging(
        "konnectivity-server",
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
    if options.warn_on_channel_limit.is_some() {
        tracing::warn!("--warn-on-channel-limit is deprecated and has no effect");
    }
    if let Some(path) = options.write_config_to.clone() {
        return cli::write_config(&options, &path);
    }
    let dev_setup = if options.dev {
        match dev::apply(&mut options) {
            Ok(setup) => Some(setup),
            Err(e) => return fail(format_args!("{e:#}")),
        }
    } else {
        None
    };
    let config = match Config::from_options(&options) {
        Ok(config) => config,
        Err(e) => return fail(format_args!("failed to validate server options with {e}")),
    };
    if options.check_config {
        return check_config(config, &options);
    }
    if config.admin_addr.ip().is_unspecified() && config.enable_profiling {
        tracing::warn!(admin = %config.admin_addr, "profiling is exposed on every interface: --admin-bind-address is empty");
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return fail(format_args!("cannot start the async runtime: {e}")),
    };
    lifecycle::raise_nofile_limit();
    let result = runtime.block_on(async move {
        let inherited = Inherited::from_systemd()?;
        let listeners = Listeners::bind_or_take(&config, inherited).await?;
        if let Some(setup) = &dev_setup {
            eprint!("{}", setup.describe(options.agent_port));
        }
        lifecycle::run_service(cli, config, listeners).await?;
        Ok::<(), anyhow::Error>(())
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(format_args!("{e:#}")),
    }
}

/// One line and an exit code, for systemd's ExecStartPre and ExecReload.
fn check_config(config: Config, options: &Options) -> ExitCode {
    let built = Snapshot::build(config)
        .map(|_| ())
        .map_err(|e| e.to_string());
    cli::check_result(options.config.as_deref(), built)
}

//! What both binaries do before they run: parse the command line as cobra reports errors,
//! write the effective configuration, say why a start failed, and flush the log writer
//! however `main` ends.

use std::process::ExitCode;

use crate::config::layers::{self, CommandLine};
use crate::config::{Layered, LogFormat};
use crate::logging;

/// klog's logging flags, as both programs have them.
pub struct LogFlags<'a> {
    pub v: u32,
    pub vmodule: &'a str,
    pub log_format: LogFormat,
    pub logtostderr: bool,
    pub alsologtostderr: bool,
    pub log_file: &'a str,
    pub log_dir: &'a str,
    pub log_file_max_size: u64,
}

/// Starts logging as the flags say (stderr, journald or klog's file); `program` names the
/// journal identifier and the file in `--log-dir`.
pub fn init_logging(program: &'static str, flags: &LogFlags<'_>) {
    let file = logging::FileSink::from_klog(
        program,
        flags.logtostderr,
        flags.log_file,
        flags.log_dir,
        flags.log_file_max_size,
        flags.alsologtostderr,
    );
    logging::init(program, flags.v, flags.vmodule, flags.log_format, file);
}

/// Prints `message` and returns upstream's exit code for a bad start.
pub fn fail(message: impl std::fmt::Display) -> ExitCode {
    // The log lines before it come first.
    logging::finish();
    eprintln!("Error: {message}");
    ExitCode::from(1)
}

/// Writes out the log lines the writer thread still holds when `main` ends, by a return or
/// by a panic unwinding through it. Hold one for the whole of `main`.
pub struct FinishLogs;

impl Drop for FinishLogs {
    fn drop(&mut self) {
        logging::finish();
    }
}

/// Parses the process's command line. Help and version go to stdout with 0; bad flags exit 1
/// with cobra's `Error: ...` first line, as upstream.
pub fn parse<O: Layered>() -> Result<CommandLine<O>, ExitCode> {
    CommandLine::<O>::parse_as(std::env::args_os()).map_err(|e| {
        if !e.use_stderr() {
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
        let text = e.to_string();
        eprint!("Error: {}", text.strip_prefix("error: ").unwrap_or(&text));
        ExitCode::from(1)
    })
}

/// `--write-config-to PATH`: the effective configuration as TOML (`-` for stdout).
pub fn write_config<O: Layered>(options: &O, path: &std::path::Path) -> ExitCode {
    let text = layers::to_toml(options);
    let written = if path.as_os_str() == "-" {
        print!("{text}");
        Ok(())
    } else {
        std::fs::write(path, text)
    };
    match written {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(format_args!("writing {}: {e}", path.display())),
    }
}

/// `--check-config`'s one line (for systemd's ExecStartPre and ExecReload) and exit code.
pub fn check_result(config_file: Option<&std::path::Path>, result: Result<(), String>) -> ExitCode {
    let source = config_file
        .map(|p| p.display().to_string())
        .unwrap_or_else(|| "no config file".into());
    match result {
        Ok(()) => {
            println!("configuration OK ({source})");
            ExitCode::SUCCESS
        }
        Err(e) => {
            println!("configuration invalid ({source}): {e}");
            ExitCode::from(1)
        }
    }
}

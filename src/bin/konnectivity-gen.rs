//! konnectivity-gen: writes the man pages and shell completions that the packages ship.
//!
//!   konnectivity-gen OUT_DIR
//!
//! writes, under OUT_DIR, for konnectivity-server, konnectivity-agent and kube-proxy:
//!   man/<program>.8                 the program (its clap flags)
//!   man/<program>-<command>.8       each of its commands (konnectivity-server tunnels,
//!                                   kube-proxy trace)
//!   man/<program>.toml.5            its config file (from the complete reference in config/)
//!   completions/{bash,zsh,fish}/... for each program
//!
//! Not packaged: packaging/build.sh runs it from the release build (`cargo build --release
//! --bins` builds it beside the programs, so packaging needs no second build). The output
//! depends only on the sources (no date, no build path), so the packages stay reproducible.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::CommandFactory;
use clap_complete::Shell;
use clap_mangen::roff::{bold, italic, roman, Inline, Roff};
use clap_mangen::Man;

use kube_traffic::agent::AgentOptions;
use kube_traffic::config::Options;
use kube_traffic::kube_proxy::options::KubeProxyOptions;
use kube_traffic::kube_proxy::trace_cli::{self, TraceArgs};
use kube_traffic::tunnels_cli::TunnelsArgs;

/// Section 8: the programs are daemons that systemd starts, not commands a user runs.
const PROGRAM_SECTION: &str = "8";
const CONFIG_SECTION: &str = "5";
const VERSION: &str = env!("CARGO_PKG_VERSION");

/// What differs between the programs' pages.
struct Program {
    name: &'static str,
    /// The config file's page: `<name>.toml`.
    config_page: &'static str,
    command: clap::Command,
    /// The complete configuration reference (config/<file>.toml), the source of the
    /// config page.
    reference: &'static str,
    config_path: &'static str,
    /// Its owner and mode as packaged.
    config_owner: &'static str,
    /// A flag the CONFIGURATION section names as the example of a key (one the page lists).
    example_flag: &'static str,
    /// What else the CONFIGURATION section says (other file formats, the default file).
    config_note: &'static str,
    env_prefix: &'static str,
    /// Upstream's variable for the program's id, if it has one.
    id_env: Option<&'static str>,
    defaults_file: &'static str,
    args_var: &'static str,
    /// Where the admin puts the credentials the packaged configuration names, and what.
    credentials: (&'static str, &'static str),
    /// The unit, in a sentence.
    unit: &'static str,
    extra_files: &'static [(&'static str, &'static str)],
    signals: &'static [(&'static str, &'static str)],
}

fn programs() -> [Program; 3] {
    [
        Program {
            name: "konnectivity-server",
            config_page: "konnectivity-server.toml",
            // The `tunnels` command is in the page's synopsis and in the completions.
            command: Options::command()
                .subcommand(TunnelsArgs::command())
                .disable_help_subcommand(true),
            reference: include_str!("../../config/server.toml"),
            config_path: "/etc/konnectivity/server.toml",
            config_owner: "root:<user> 0640",
            example_flag: "log-file-max-size",
            config_note: "",
            env_prefix: "KONNECTIVITY_SERVER_",
            id_env: Some("PROXY_SERVER_ID"),
            defaults_file: "/etc/default/konnectivity-server",
            args_var: "KONNECTIVITY_SERVER_ARGS",
            credentials: ("/etc/konnectivity/pki/", PKI_NOTE),
            unit: UNIT_NOTE,
            extra_files: &[
                (
                    "/run/konnectivity-server/konnectivity-server.socket",
                    "The gRPC Unix socket kube-apiserver connects to (packaged configuration), \
                     held by konnectivity-server.socket when that unit is active.",
                ),
                (
                    "/usr/share/doc/konnectivity-server/examples/10-notify-reload.conf",
                    "A drop-in for systemd 253 and newer: Type=notify-reload, so that \
                     systemctl reload waits until the new configuration is live.",
                ),
            ],
            signals: &[
                (
                    "SIGHUP",
                    "Reload the configuration file and the certificates in place; live tunnels \
                     are kept. An invalid configuration is logged and the running one is kept.",
                ),
                (
                    "SIGTERM, SIGINT",
                    "Stop accepting, let live tunnels run for graceful_shutdown_timeout, then \
                     exit 0.",
                ),
            ],
        },
        Program {
            name: "konnectivity-agent",
            config_page: "konnectivity-agent.toml",
            command: AgentOptions::command(),
            reference: include_str!("../../config/agent.toml"),
            config_path: "/etc/konnectivity/agent.toml",
            config_owner: "root:<user> 0640",
            example_flag: "log-file-max-size",
            config_note: "",
            env_prefix: "KONNECTIVITY_AGENT_",
            id_env: Some("PROXY_AGENT_ID"),
            defaults_file: "/etc/default/konnectivity-agent",
            args_var: "KONNECTIVITY_AGENT_ARGS",
            credentials: ("/etc/konnectivity/agent-pki/", PKI_NOTE),
            unit: UNIT_NOTE,
            extra_files: &[],
            signals: &[
                (
                    "SIGHUP",
                    "Reload the configuration file, certificates and token; new server \
                     connections and dials use them, live tunnels are untouched.",
                ),
                (
                    "SIGTERM, SIGINT",
                    "Send DRAIN to every server and exit 0 once no tunnel is open or \
                     graceful_shutdown_timeout is up (with \"0s\", a second signal stops it).",
                ),
            ],
        },
        Program {
            name: "kube-proxy",
            config_page: "kube-proxy.toml",
            // `kube-proxy trace` is in the page's synopsis and in the completions. Upstream's
            // help text (the command's about) is long: it is the DESCRIPTION, and NAME gets
            // a line.
            command: {
                let mut command = KubeProxyOptions::command();
                if let Some(about) = command.get_about().cloned() {
                    command = command.long_about(about);
                }
                command
                    .about("the Kubernetes network proxy: the node's Services in nftables")
                    .subcommand(TraceArgs::command().name(trace_cli::NAME))
                    .disable_help_subcommand(true)
            },
            reference: include_str!("../../config/kube-proxy.toml"),
            config_path: "/etc/kubernetes/kube-proxy.toml",
            config_owner: "root:root 0644",
            example_flag: "conntrack-max-per-core",
            config_note: "The file is read when it exists, also without --config. --config also takes \
                upstream's KubeProxyConfiguration (kubeproxy.config.k8s.io/v1alpha1, YAML or JSON), as \
                kubeadm writes it; unlike upstream, flags given with it still apply.",
            env_prefix: "KUBE_PROXY_",
            id_env: None,
            defaults_file: "/etc/default/kube-proxy",
            args_var: "KUBE_PROXY_ARGS",
            credentials: (
                "/etc/kubernetes/kube-proxy.kubeconfig",
                "The kubeconfig the packaged configuration names: the API server, its CA and \
                 credentials bound to the ClusterRole system:node-proxier. The unit is skipped at \
                 boot until it exists.",
            ),
            unit: "The systemd unit: Type=notify (ready once the first sync is in the kernel), \
                reload on SIGHUP after --check-config, watchdog while syncs are healthy; root with \
                CAP_NET_ADMIN and CAP_NET_RAW only.",
            extra_files: &[(
                "/usr/lib/tmpfiles.d/kube-proxy.conf",
                "Creates /run/xtables.lock, the lock iptables-legacy-restore takes when the \
                 iptables leftovers of upstream's iptables mode are removed at start.",
            )],
            signals: &[
                (
                    "SIGHUP",
                    "Read the configuration again and apply it (a sync with the new settings); the \
                     mode, node name, API connection, bind address and feature gates keep their \
                     running values until a restart. An invalid configuration is logged and the \
                     running one is kept. Saving the configuration file does the same.",
                ),
                (
                    "SIGTERM, SIGINT",
                    "Exit 0. The rules stay in the kernel: Services keep working until the next \
                     start takes them over (kube-proxy --cleanup removes them).",
                ),
            ],
        },
    ]
}

/// The FILES entry of a Konnectivity program's certificate directory.
const PKI_NOTE: &str = "Where the packaged configuration expects certificates and keys; the unit \
    is skipped at boot until they exist.";
const UNIT_NOTE: &str =
    "The systemd unit: Type=notify, reload on SIGHUP after --check-config, watchdog.";

fn main() -> Result<()> {
    let mut args = std::env::args_os().skip(1);
    let (Some(out), None) = (args.next(), args.next()) else {
        bail!("usage: konnectivity-gen OUT_DIR");
    };
    let out = PathBuf::from(out);
    for program in programs() {
        write(
            &out.join("man")
                .join(format!("{}.{PROGRAM_SECTION}", program.name)),
            &program_page(&program)?,
        )?;
        write(
            &out.join("man")
                .join(format!("{}.{CONFIG_SECTION}", program.config_page)),
            &config_page(&program)?,
        )?;
        // A page of its own for each command (`konnectivity-server-tunnels(8)`), which the
        // program's page names under SUBCOMMANDS.
        for sub in program.command.get_subcommands() {
            let name = format!("{}-{}", program.name, sub.get_name());
            let command = sub.clone().display_name(&name).bin_name(format!(
                "{} {}",
                program.name,
                sub.get_name()
            ));
            // Its own commands (`close`) are in its description: they have no pages.
            let page = man(command, &name, PROGRAM_SECTION, program.name);
            let mut buffer = Vec::new();
            page.render_title(&mut buffer)?;
            page.render_name_section(&mut buffer)?;
            page.render_synopsis_section(&mut buffer)?;
            page.render_description_section(&mut buffer)?;
            page.render_options_section(&mut buffer)?;
            write(
                &out.join("man").join(format!("{name}.{PROGRAM_SECTION}")),
                &buffer,
            )?;
        }
        for (shell, dir, file) in [
            (Shell::Bash, "bash", program.name.to_string()),
            (Shell::Zsh, "zsh", format!("_{}", program.name)),
            (Shell::Fish, "fish", format!("{}.fish", program.name)),
        ] {
            let mut command = program.command.clone();
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut command, program.name, &mut script);
            write(&out.join("completions").join(dir).join(file), &script)?;
        }
    }
    Ok(())
}

fn write(path: &Path, contents: &[u8]) -> Result<()> {
    if let Some(dir) = path.parent() {
        fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    fs::write(path, contents).with_context(|| format!("writing {}", path.display()))
}

/// `package`: the package the page comes with, named in its footer.
fn man(command: clap::Command, title: &str, section: &str, package: &str) -> Man {
    Man::new(command)
        .title(title.to_uppercase())
        .section(section)
        .source(format!("{package} {VERSION}"))
        .manual(if section == PROGRAM_SECTION {
            "System Administration"
        } else {
            "File Formats"
        })
}

/// The program's page: clap's NAME, SYNOPSIS, DESCRIPTION and OPTIONS, then what the flags
/// do not say (the layers, the files, the signals, the unit).
fn program_page(p: &Program) -> Result<Vec<u8>> {
    let page = man(p.command.clone(), p.name, PROGRAM_SECTION, p.name);
    let mut out = Vec::new();
    page.render_title(&mut out)?;
    page.render_name_section(&mut out)?;
    page.render_synopsis_section(&mut out)?;
    page.render_description_section(&mut out)?;
    page.render_options_section(&mut out)?;
    if p.command.has_subcommands() {
        page.render_subcommands_section(&mut out)?;
    }

    let mut r = Roff::new();
    r.control("SH", ["CONFIGURATION"]);
    r.text([
        roman("Every flag is also a key of the TOML file "),
        bold(p.config_path),
        roman(" (the flag name in snake_case, e.g. "),
        bold(format!("--{}", p.example_flag)),
        roman(" is "),
        bold(p.example_flag.replace('-', "_")),
        roman(") and an environment variable "),
        bold(format!(
            "{}{}",
            p.env_prefix,
            p.example_flag.replace('-', "_").to_uppercase()
        )),
        roman(". Layers, lowest first: built-in defaults, the file, the environment, the command line. Every key is described in "),
        bold(format!("{}.toml", p.name)),
        roman(format!("({CONFIG_SECTION}).")),
    ]);
    if !p.config_note.is_empty() {
        r.control("PP", []);
        r.text([roman(p.config_note)]);
    }
    r.control("SH", ["ENVIRONMENT"]);
    r.control("TP", []);
    r.text([bold(format!("{}<KEY>", p.env_prefix))]);
    r.text([roman(
        "A setting, named as the TOML key in upper case; between the file and the flags.",
    )]);
    r.control("TP", []);
    r.text([bold(format!("{}CONFIG", p.env_prefix))]);
    r.text([roman("The configuration file, when --config is not given.")]);
    if let Some(id_env) = p.id_env {
        r.control("TP", []);
        r.text([bold(id_env)]);
        r.text([roman(
            "The id, as upstream reads it; the prefixed variable for the same key overrides it.",
        )]);
    }
    r.control("TP", []);
    r.text([bold("RUST_LOG")]);
    r.text([roman(
        "When set, the log filter; it takes precedence over -v.",
    )]);
    r.control("SH", ["SIGNALS"]);
    for (signal, what) in p.signals {
        r.control("TP", []);
        r.text([bold(*signal)]);
        r.text([roman(*what)]);
    }
    r.control("SH", ["FILES"]);
    let unit = format!("/usr/lib/systemd/system/{}.service", p.name);
    let files: Vec<(&str, String)> = [
        (
            p.config_path,
            format!("The configuration file ({}).", p.config_owner),
        ),
        (
            p.defaults_file,
            format!(
                "The unit's environment: {} holds the arguments of ExecStartPre= (--check-config), ExecStart= and ExecReload=.",
                p.args_var
            ),
        ),
        (p.credentials.0, p.credentials.1.to_string()),
        (unit.as_str(), p.unit.to_string()),
    ]
    .into_iter()
    .chain(p.extra_files.iter().map(|(f, w)| (*f, w.to_string())))
    .collect();
    for (file, what) in files {
        r.control("TP", []);
        r.text([italic(file)]);
        r.text([roman(what)]);
    }
    r.control("SH", ["SEE ALSO"]);
    r.text([
        bold(format!("{}.toml", p.name)),
        roman(format!("({CONFIG_SECTION}), ")),
        bold("systemctl"),
        roman("(1), "),
        bold("systemd.service"),
        roman("(5), and /usr/share/doc/"),
        roman(p.name),
        roman("/."),
    ]);
    out.write_all(r.to_roff().as_bytes())?;
    Ok(out)
}

/// The config file's page, from the complete reference: its opening comment is the
/// description, each `# --- Title ---` a subsection, each comment the text of the keys that
/// follow it (shown as in the file, with their defaults).
fn config_page(p: &Program) -> Result<Vec<u8>> {
    let file = p.config_page;
    let about = format!("configuration file of {}({PROGRAM_SECTION})", p.name);
    let page = man(
        clap::Command::new(file).about(about),
        file,
        CONFIG_SECTION,
        p.name,
    );
    let mut out = Vec::new();
    page.render_title(&mut out)?;
    page.render_name_section(&mut out)?;

    let mut r = Roff::new();
    r.control("SH", ["SYNOPSIS"]);
    r.text([italic(p.config_path)]);
    r.control("SH", ["DESCRIPTION"]);
    r.text([
        roman(format!(
            "The TOML configuration of {}. Its keys are the command-line flags of ",
            p.name
        )),
        bold(p.name),
        roman(format!(
            "({PROGRAM_SECTION}). The package installs a short deployment file; the complete reference, from which this page is made, is /usr/share/doc/{}/{}.",
            p.name,
            p.config_path.rsplit('/').next().unwrap_or_default()
        )),
    ]);

    let mut lines = p.reference.lines().peekable();
    // The opening comment (the title line is the page's NAME already).
    let mut intro: Vec<&str> = Vec::new();
    if lines.next_if(|l| l.starts_with("# ")).is_none() {
        bail!("the reference for {file}: no opening comment");
    }
    while let Some(line) = lines.next_if(|l| !l.trim().is_empty()) {
        intro.push(comment(line).with_context(|| format!("the reference for {file}: {line:?}"))?);
    }
    block(&mut r, &intro, &[]);

    r.control("SH", ["SETTINGS"]);
    let mut text: Vec<&str> = Vec::new();
    let mut keys: Vec<&str> = Vec::new();
    for line in lines {
        let line = line.trim_end();
        if let Some(title) = section_title(line) {
            block(&mut r, &text, &keys);
            (text, keys) = (Vec::new(), Vec::new());
            r.control("SS", [title]);
        } else if line.is_empty() {
            block(&mut r, &text, &keys);
            (text, keys) = (Vec::new(), Vec::new());
        } else if is_key(line) || is_table(line) || line.strip_prefix("# ").is_some_and(is_key) {
            // A commented-out key (no default to show) is an example of the setting.
            keys.push(line);
        } else if let Some(c) = comment(line) {
            if !keys.is_empty() {
                block(&mut r, &text, &keys);
                (text, keys) = (Vec::new(), Vec::new());
            }
            text.push(c);
        } else {
            bail!("the reference for {file}: a line that is neither a comment nor a key: {line:?}");
        }
    }
    block(&mut r, &text, &keys);

    r.control("SH", ["SEE ALSO"]);
    r.text([
        bold(p.name),
        roman(format!("({PROGRAM_SECTION}), ")),
        roman("https://toml.io/"),
    ]);
    out.write_all(r.to_roff().as_bytes())?;
    Ok(out)
}

/// `# --- Title ----`: the title.
fn section_title(line: &str) -> Option<&str> {
    let title = line.strip_prefix("# --- ")?.trim_end_matches('-').trim();
    (!title.is_empty()).then_some(title)
}

fn comment(line: &str) -> Option<&str> {
    if line == "#" {
        Some("")
    } else {
        line.strip_prefix("# ")
    }
}

/// `key = value`
fn is_key(line: &str) -> bool {
    line.split_once(" = ").is_some_and(|(key, _)| {
        !key.is_empty()
            && key
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
    })
}

/// `[table]`: a TOML table header (kube-proxy's `[feature_gates]`), shown as a key is.
fn is_table(line: &str) -> bool {
    line.strip_prefix('[')
        .and_then(|l| l.strip_suffix(']'))
        .is_some_and(|name| {
            !name.is_empty() && name.bytes().all(|b| b.is_ascii_lowercase() || b == b'_')
        })
}

/// A paragraph of comment text (indented lines kept as they are), then its keys as in the file.
fn block(r: &mut Roff, text: &[&str], keys: &[&str]) {
    if text.is_empty() && keys.is_empty() {
        return;
    }
    r.control("PP", []);
    let mut words: Vec<Inline> = Vec::new();
    let mut verbatim = false;
    for line in text {
        // An empty comment line ("#") separates paragraphs.
        if line.is_empty() {
            if !words.is_empty() {
                r.text(std::mem::take(&mut words));
            }
            r.control("PP", []);
            continue;
        }
        let indented = line.starts_with("  ");
        if indented != verbatim {
            if !words.is_empty() {
                r.text(std::mem::take(&mut words));
            }
            r.control(if indented { "nf" } else { "fi" }, []);
            verbatim = indented;
        }
        if indented {
            r.text([roman(line.trim_start())]);
        } else {
            if !words.is_empty() {
                words.push(roman(" "));
            }
            words.push(roman(*line));
        }
    }
    if !words.is_empty() {
        r.text(words);
    }
    if verbatim {
        r.control("fi", []);
    }
    if keys.is_empty() {
        return;
    }
    r.control("RS", []);
    r.control("nf", []);
    for key in keys {
        match key.split_once(" = ") {
            Some((name, value)) if !name.starts_with('#') => {
                r.text([bold(name), roman(format!(" = {value}"))]);
            }
            _ => {
                r.text([roman(*key)]);
            }
        }
    }
    r.control("fi", []);
    r.control("RE", []);
}

//! `tpar settings`: every environment variable tpar reads, from the library's one
//! declaration of them (`tpar::settings`), with the values set in this shell; `--check`
//! parses them as every rank would and says which one is malformed.

use clap::Args;

#[derive(Args, Debug)]
#[command(after_help = "Every rank of a job reads the same variables at start; the tpar command checks them once before it starts any rank. Engines read them in each worker (Python parses none of them except TPAR_ENABLE).")]
pub struct SettingsArgs {
    /// Print the table as Markdown (the README's table is this output)
    #[arg(long)]
    pub markdown: bool,
    /// Parse the variables set in this environment and report the first malformed one
    /// (exit status 2), as a communicator would at init
    #[arg(long)]
    pub check: bool,
}

pub fn run(args: SettingsArgs) -> Result<(), String> {
    if args.check {
        tpar::Settings::from_env().map_err(|e| crate::exit::refuse(e.to_string()))?;
        println!("tpar settings: every TPAR_* variable set here parses");
        return Ok(());
    }
    if args.markdown {
        print!("{}", tpar::settings::markdown_table());
    } else {
        print!("{}", tpar::settings::text_table());
    }
    Ok(())
}

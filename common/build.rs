//! `sqlx::migrate!` embeds ../migrations at compile time; without this a new
//! migration file does not rebuild engram-common, and a stale binary then
//! fails against a database that already has it.
fn main() {
    println!("cargo:rerun-if-changed=../migrations");
}

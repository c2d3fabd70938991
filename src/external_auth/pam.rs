//! `auth_type = pam`: the client's cleartext password goes to the PAM service "pgbouncer"
//! (PgBouncer's name, so an existing /etc/pam.d/pgbouncer keeps working), with the
//! client's address as PAM_RHOST; `pam_authenticate`, then `pam_acct_mgmt`, as PgBouncer
//! calls them. libpam is loaded when first needed rather than linked, so that building
//! Weir needs no libpam headers and a machine without libpam runs everything but PAM;
//! the configuration is refused at load when it asks for PAM that cannot be loaded.

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

const SERVICE: &CStr = c"pgbouncer";

// Linux-PAM's values (security/_pam_types.h); the same in OpenPAM for these.
const PAM_SUCCESS: c_int = 0;
const PAM_BUF_ERR: c_int = 5;
const PAM_CONV_ERR: c_int = 19;
const PAM_RHOST: c_int = 4;
const PAM_SILENT: c_int = 0x8000;
const PAM_PROMPT_ECHO_OFF: c_int = 1;
const PAM_ERROR_MSG: c_int = 3;

#[repr(C)]
struct PamMessage {
    msg_style: c_int,
    msg: *const c_char,
}

#[repr(C)]
struct PamResponse {
    resp: *mut c_char,
    resp_retcode: c_int,
}

type ConvFn = unsafe extern "C" fn(
    c_int,
    *mut *const PamMessage,
    *mut *mut PamResponse,
    *mut c_void,
) -> c_int;

#[repr(C)]
struct PamConv {
    conv: ConvFn,
    appdata_ptr: *mut c_void,
}

type Handle = *mut c_void;
type StartFn =
    unsafe extern "C" fn(*const c_char, *const c_char, *const PamConv, *mut Handle) -> c_int;
type StartConfdirFn = unsafe extern "C" fn(
    *const c_char,
    *const c_char,
    *const PamConv,
    *const c_char,
    *mut Handle,
) -> c_int;
type SetItemFn = unsafe extern "C" fn(Handle, c_int, *const c_void) -> c_int;
type StepFn = unsafe extern "C" fn(Handle, c_int) -> c_int;
type StrerrorFn = unsafe extern "C" fn(Handle, c_int) -> *const c_char;

struct Lib {
    start: StartFn,
    /// Linux-PAM 1.4 and later: a directory other than /etc/pam.d (auth_pam_confdir).
    start_confdir: Option<StartConfdirFn>,
    set_item: SetItemFn,
    authenticate: StepFn,
    acct_mgmt: StepFn,
    end: StepFn,
    strerror: StrerrorFn,
    /// Kept loaded for the life of the process: the functions above point into it.
    _lib: libloading::Library,
}

fn lib() -> Result<&'static Lib, String> {
    static LIB: OnceLock<Result<Lib, String>> = OnceLock::new();
    LIB.get_or_init(load).as_ref().map_err(Clone::clone)
}

fn load() -> Result<Lib, String> {
    // SAFETY: libpam's initialisers have no preconditions; the symbols are read with the
    // signatures of security/pam_appl.h.
    unsafe {
        let lib = libloading::Library::new("libpam.so.0")
            .map_err(|e| format!("cannot load libpam.so.0 ({e}); install libpam0g"))?;
        let sym = |name: &[u8]| -> Result<*const c_void, String> {
            lib.get::<*const c_void>(name)
                .map(|s| *s)
                .map_err(|e| format!("libpam.so.0: {e}"))
        };
        let start = sym(b"pam_start\0")?;
        let set_item = sym(b"pam_set_item\0")?;
        let authenticate = sym(b"pam_authenticate\0")?;
        let acct_mgmt = sym(b"pam_acct_mgmt\0")?;
        let end = sym(b"pam_end\0")?;
        let strerror = sym(b"pam_strerror\0")?;
        let start_confdir = sym(b"pam_start_confdir\0").ok();
        Ok(Lib {
            start: std::mem::transmute::<*const c_void, StartFn>(start),
            start_confdir: start_confdir
                .map(|f| std::mem::transmute::<*const c_void, StartConfdirFn>(f)),
            set_item: std::mem::transmute::<*const c_void, SetItemFn>(set_item),
            authenticate: std::mem::transmute::<*const c_void, StepFn>(authenticate),
            acct_mgmt: std::mem::transmute::<*const c_void, StepFn>(acct_mgmt),
            end: std::mem::transmute::<*const c_void, StepFn>(end),
            strerror: std::mem::transmute::<*const c_void, StrerrorFn>(strerror),
            _lib: lib,
        })
    }
}

/// Whether PAM can be used as configured: at load, so that `auth_type = pam` without
/// libpam (or auth_pam_confdir without a libpam that has pam_start_confdir) is refused
/// there, not at every login.
pub fn check_available(confdir: Option<&Path>) -> Result<(), String> {
    let lib = lib().map_err(|e| format!("auth_type = pam: {e}"))?;
    if confdir.is_some() && lib.start_confdir.is_none() {
        return Err(
            "auth_pam_confdir: this libpam has no pam_start_confdir (Linux-PAM 1.4 or later)"
                .into(),
        );
    }
    Ok(())
}

/// Whether PAM accepts `password` for `user` from `rhost`. Logs why not, as PgBouncer does.
pub async fn check(user: &str, password: &[u8], rhost: String, confdir: Option<PathBuf>) -> bool {
    let (Ok(user), Ok(password), Ok(rhost)) = (
        CString::new(user),
        CString::new(password),
        CString::new(rhost),
    ) else {
        return false;
    };
    let confdir = match confdir.map(|d| CString::new(d.into_os_string().into_encoded_bytes())) {
        Some(Ok(d)) => Some(d),
        Some(Err(_)) => return false,
        None => None,
    };
    super::run_blocking(&super::PAM_SLOTS, move || {
        authenticate(&user, &password, &rhost, confdir.as_deref())
    })
    .await
}

fn strerror(lib: &Lib, handle: Handle, rc: c_int) -> String {
    // SAFETY: pam_strerror returns a static string (or null) for any code; a null handle
    // is allowed.
    let s = unsafe { (lib.strerror)(handle, rc) };
    if s.is_null() {
        return format!("error {rc}");
    }
    // SAFETY: non-null, NUL-terminated, static.
    unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned()
}

fn authenticate(user: &CStr, password: &CStr, rhost: &CStr, confdir: Option<&CStr>) -> bool {
    let Ok(lib) = lib() else {
        return false;
    };
    let conv = PamConv {
        conv: conversation,
        appdata_ptr: password.as_ptr() as *mut c_void,
    };
    let mut handle: Handle = std::ptr::null_mut();
    // SAFETY: every pointer is valid and NUL-terminated for the call; conv, and the
    // password it points at, outlive the PAM transaction (pam_end below, in this frame).
    let rc = unsafe {
        match (confdir, lib.start_confdir) {
            (Some(dir), Some(start)) => start(
                SERVICE.as_ptr(),
                user.as_ptr(),
                &conv,
                dir.as_ptr(),
                &mut handle,
            ),
            (Some(_), None) => return false,
            (None, _) => (lib.start)(SERVICE.as_ptr(), user.as_ptr(), &conv, &mut handle),
        }
    };
    if rc != PAM_SUCCESS {
        tracing::warn!(
            "pam_start() failed: {}",
            strerror(lib, std::ptr::null_mut(), rc)
        );
        return false;
    }
    let fail = |what: &str, rc: c_int| {
        tracing::warn!("{what} failed: {}", strerror(lib, handle, rc));
        // SAFETY: handle came from a successful pam_start and is ended once.
        unsafe { (lib.end)(handle, rc) };
        false
    };
    // SAFETY: handle is live; PAM copies the item.
    let rc = unsafe { (lib.set_item)(handle, PAM_RHOST, rhost.as_ptr() as *const c_void) };
    if rc != PAM_SUCCESS {
        return fail("pam_set_item(PAM_RHOST)", rc);
    }
    // SAFETY: handle is live.
    let rc = unsafe { (lib.authenticate)(handle, PAM_SILENT) };
    if rc != PAM_SUCCESS {
        return fail("pam_authenticate()", rc);
    }
    // Expired accounts, access hours and the like.
    // SAFETY: handle is live.
    let rc = unsafe { (lib.acct_mgmt)(handle, PAM_SILENT) };
    if rc != PAM_SUCCESS {
        return fail("pam_acct_mgmt()", rc);
    }
    // SAFETY: handle is live and ended once.
    let rc = unsafe { (lib.end)(handle, PAM_SUCCESS) };
    if rc != PAM_SUCCESS {
        tracing::warn!(
            "pam_end() failed: {}",
            strerror(lib, std::ptr::null_mut(), rc)
        );
    }
    true
}

/// PAM's questions: the password for each prompt that hides its answer; error messages
/// go to the log (pam_exec's "failed: exit code 3", for one). Responses are allocated
/// with malloc, as libpam frees them.
unsafe extern "C" fn conversation(
    count: c_int,
    messages: *mut *const PamMessage,
    responses: *mut *mut PamResponse,
    appdata: *mut c_void,
) -> c_int {
    if count < 1 || messages.is_null() || responses.is_null() || appdata.is_null() {
        return PAM_CONV_ERR;
    }
    let n = count as usize;
    // SAFETY: calloc with a size libpam gave; zeroed, so every resp starts null.
    let out = unsafe { libc::calloc(n, std::mem::size_of::<PamResponse>()) } as *mut PamResponse;
    if out.is_null() {
        return PAM_BUF_ERR;
    }
    let password = appdata as *const c_char;
    for i in 0..n {
        // SAFETY: libpam passes `count` valid message pointers (Linux-PAM's layout: an
        // array of pointers).
        let Some(m) = (unsafe { (*messages.add(i)).as_ref() }) else {
            continue;
        };
        match m.msg_style {
            PAM_PROMPT_ECHO_OFF => {
                // SAFETY: password is the NUL-terminated CString this check owns.
                let copy = unsafe { libc::strdup(password) };
                if copy.is_null() {
                    for j in 0..i {
                        // SAFETY: entries before i are null or strdup's.
                        unsafe { libc::free((*out.add(j)).resp as *mut c_void) };
                    }
                    // SAFETY: out came from calloc.
                    unsafe { libc::free(out as *mut c_void) };
                    return PAM_BUF_ERR;
                }
                // SAFETY: i < n, inside the calloc'd array.
                unsafe { (*out.add(i)).resp = copy };
            }
            PAM_ERROR_MSG if !m.msg.is_null() => {
                // SAFETY: a NUL-terminated message from the module.
                let text = unsafe { CStr::from_ptr(m.msg) }.to_string_lossy();
                tracing::warn!("pam_conversation(): PAM error: {text}");
            }
            _ => {}
        }
    }
    // SAFETY: responses is non-null (checked); libpam takes ownership of out.
    unsafe { *responses = out };
    PAM_SUCCESS
}

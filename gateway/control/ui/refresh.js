// A tab that refreshes itself: `load` runs again `everyMs` after the last one while the tab is shown,
// the page is visible and `wanted()` agrees; hiding the tab or the page stops it.
export function refresher(load, everyMs, wanted = () => true) {
  let timer = null;
  let shown = false;
  function schedule() {
    clearTimeout(timer);
    timer = null;
    if (shown && wanted() && document.visibilityState === "visible") timer = setTimeout(load, everyMs);
  }
  document.addEventListener("visibilitychange", schedule);
  return {
    get shown() {
      return shown;
    },
    show() {
      shown = true;
      load();
    },
    hide() {
      shown = false;
      clearTimeout(timer);
      timer = null;
    },
    // a load in progress: no other starts meanwhile; it calls `schedule` when done
    loading() {
      clearTimeout(timer);
    },
    schedule,
  };
}

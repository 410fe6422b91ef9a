// Our Qt <-> Dear ImGui bridge: a QOpenGLWidget that owns an ImGui context, feeds it Qt's input
// (mouse, wheel, keys, text, focus), display size and device pixel ratio, serves the clipboard
// through QClipboard, and draws ImGui's vertex lists with its own OpenGL 3.3 renderer. The widget
// repaints at a steady rate (60 Hz) so views stay live while the engine steps on its thread.
#pragma once

#include <QElapsedTimer>
#include <QOpenGLExtraFunctions>
#include <QOpenGLWidget>
#include <QTimer>
#include <functional>
#include <string>
#include <unordered_map>
#include <vector>

struct ImGuiContext;
struct ImFont;
struct ImDrawData;

namespace kvlens::app {

class ImGuiCanvas : public QOpenGLWidget, protected QOpenGLExtraFunctions {
  Q_OBJECT

 public:
  explicit ImGuiCanvas(QWidget* parent = nullptr);
  ~ImGuiCanvas() override;

  // Called inside each frame, between ImGui::NewFrame and ImGui::Render, with the GL context
  // current (textures may be made there).
  void set_frame(std::function<void()> frame) { frame_ = std::move(frame); }

  // An RGBA8 texture of `width` x `height` pixels (nearest filtering: one data cell, one sharp
  // block), for ImGui::Image / AddImage; valid until release_textures(). Needs the context.
  void* make_texture(const uint8_t* rgba, int width, int height);
  void release_textures();

  ImFont* ui_font() const { return ui_font_; }
  ImFont* figure_font() const { return figure_font_; }
  // Frames drawn since the start, and the mean frame rate over the last second.
  int64_t frames() const { return frames_; }
  double frames_per_second() const { return fps_; }
  bool wants_text_input() const;
  void request_frames(int = 2) { update(); }
  void set_animating(bool) {}

 signals:
  // A key ImGui did not take (no text field active): the window's stepping shortcuts.
  void unhandled_key(int key, Qt::KeyboardModifiers modifiers);

 protected:
  void initializeGL() override;
  void resizeGL(int width, int height) override;
  void paintGL() override;
  void mousePressEvent(QMouseEvent* event) override;
  void mouseReleaseEvent(QMouseEvent* event) override;
  void mouseMoveEvent(QMouseEvent* event) override;
  void wheelEvent(QWheelEvent* event) override;
  void keyPressEvent(QKeyEvent* event) override;
  void keyReleaseEvent(QKeyEvent* event) override;
  void focusInEvent(QFocusEvent* event) override;
  void focusOutEvent(QFocusEvent* event) override;
  bool event(QEvent* event) override;

 private:
  void make_current_context() const;
  void build_fonts();
  void create_device_objects();
  void destroy_device_objects();
  void render_draw_data(ImDrawData* draw);
  void key_event(QKeyEvent* event, bool down);
  void mouse_button(QMouseEvent* event, bool down);

  ImGuiContext* context_ = nullptr;
  bool gl_ready_ = false;  // an OpenGL context was made (not on platforms without one)
  ImFont* ui_font_ = nullptr;
  ImFont* figure_font_ = nullptr;
  std::function<void()> frame_;
  QTimer repaint_timer_;
  QElapsedTimer clock_;
  double last_frame_seconds_ = 0.0;
  int64_t frames_ = 0;
  double fps_ = 0.0, fps_window_start_ = 0.0;
  int64_t fps_window_frames_ = 0;
  qreal font_ratio_ = 0.0;  // the device pixel ratio the font atlas was built for
  std::string clipboard_;   // what GetClipboardText returns points here

  unsigned program_ = 0, vertex_buffer_ = 0, index_buffer_ = 0, vertex_array_ = 0;
  unsigned font_texture_ = 0;
  int projection_location_ = -1, texture_location_ = -1;
  std::vector<unsigned> textures_;
};

}  // namespace kvlens::app
